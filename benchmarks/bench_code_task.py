"""Throughput of task=code scoring: a rollout-sized batch of completions through the sandbox.

    PYTHONPATH=. python benchmarks/bench_code_task.py [--n 64] [--workers 8] [--repeats 3] [--compare REV]

Reports programs/s (median of the repeats), the CPU time of the sandbox processes per program (a figure
that a loaded machine changes less than the rate) and the growth of this process's peak RSS while scoring,
for correct programs, correct programs after 0.1 s of top-level work, programs that loop until the timeout
(1 s here) and programs whose every call returns ~1 MB of JSON; and the isolation level in force.
``--compare REV`` also loads the sandbox (``sandbox.py``, or the ``sandbox/`` package) and ``code_task.py`` as
they were at git revision REV and measures both, interleaved (old, new, old, new, ...) so that a machine whose
load changes during the run affects both alike; it prints the ratio new/old.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prorl_bench.config import CodeTaskConfig, RewardKind, TaskConfig
from prorl_bench.tasks.code_task import CodeTask
from prorl_bench.tasks.sandbox import isolation_level

ROOT = Path(__file__).resolve().parent.parent


def old_task_class(rev: str) -> type:
    """``CodeTask`` as of ``rev`` (its own sandbox.py), importable beside the current one."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_code_task_"))

    def show(path: str) -> str:
        """``path`` at ``rev``: under prorl_bench/tasks/ since the subpackage layout, at the top before it."""
        for candidate in (f"prorl_bench/tasks/{path}", f"prorl_bench/{path}"):
            done = subprocess.run(["git", "show", f"{rev}:{candidate}"], cwd=ROOT, capture_output=True, text=True)
            if done.returncode == 0:
                return done.stdout
        raise FileNotFoundError(f"{path} not found at {rev}")

    package = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:prorl_bench/tasks/sandbox"], cwd=ROOT,
                             capture_output=True, text=True)  # fmt: skip
    if package.returncode == 0:  # the sandbox package (issue 44 on): copied as ``old_sandbox``, imports renamed
        (tmp / "old_sandbox").mkdir()
        for name in package.stdout.split():
            text = show(f"sandbox/{name}").replace("prorl_bench.tasks.sandbox", "old_sandbox")
            (tmp / "old_sandbox" / name).write_text(text)
    else:
        (tmp / "old_sandbox.py").write_text(show("sandbox.py"))
    try:  # the runner beside it (read by the old sandbox from its own directory), where REV had one
        (tmp / "sandbox_runner.py").write_text(show("sandbox_runner.py"))
    except FileNotFoundError:
        pass
    code = show("code_task.py")
    for old_import in ("from prorl_bench.tasks.sandbox import", "from prorl_bench.sandbox import"):
        code = code.replace(old_import, "from old_sandbox import")
    (tmp / "old_code_task.py").write_text(code.replace('@TASKS.register("code")', ""))
    sys.path.insert(0, str(tmp))
    spec = importlib.util.spec_from_file_location("old_code_task", tmp / "old_code_task.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_code_task"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    module.DATA_DIR = ROOT / "prorl_bench" / "data" / "code"  # the problems as shipped now
    return module.CodeTask


def _peak_rss_growth(fn) -> tuple[object, float]:
    """(fn(), growth of this process's peak RSS in MiB while fn ran), via clear_refs' peak reset."""

    def read(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = read("VmRSS:")
    out = fn()
    return out, (read("VmHWM:") - before) / 2**20


def _children_cpu() -> float:
    """User + system CPU seconds of every reaped descendant (the sandboxes: runner, children, unshare)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compare", default=None, help="a git revision whose sandbox to measure alongside")
    args = p.parse_args()
    cfg = TaskConfig(name="code", reward=RewardKind.partial, code=CodeTaskConfig(timeout_s=1.0, workers=args.workers))
    tasks = {"new": CodeTask(cfg)}
    if args.compare:
        tasks = {f"old ({args.compare})": old_task_class(args.compare)(cfg), **tasks}
    train = tasks["new"]._train
    problems = (train * (args.n // len(train) + 1))[: args.n]
    kinds = {
        "correct": [f"```python\n{p.solution}\n```" for p in problems],
        # correct, after 0.1 s of top-level work (a slow import): paid once per sample, or once per test
        "slow_top": [f"```python\nimport time\ntime.sleep(0.1)\n{p.solution}\n```" for p in problems],
        "timeout": ["```python\nwhile True:\n    pass\n```"] * args.n,
        # every call returns ~1 MB of JSON (wrong answers): the scorer's memory
        "huge": ["```python\ndef f(*a):\n    return [[]] * 260000\n```"] * min(args.n, 8),  # 8: the old kept all
    }
    huge_problems = [dataclasses.replace(p, entry_point="f") for p in problems]
    print(f"isolation: {isolation_level()}, {args.n} programs, {args.workers} workers")
    for kind, completions in kinds.items():
        rates: dict[str, list[float]] = {name: [] for name in tasks}
        cpu: dict[str, list[float]] = {name: [] for name in tasks}
        rss: dict[str, list[float]] = {name: [] for name in tasks}
        probs = huge_problems[: len(completions)] if kind == "huge" else problems
        for _ in range(args.repeats):
            for name, task in tasks.items():  # interleaved: load changes hit every version alike
                c0, t0 = _children_cpu(), time.perf_counter()
                (rewards, _, _), grew = _peak_rss_growth(lambda t=task, c=completions, p=probs: t.score_many(c, p))
                rates[name].append(len(completions) / (time.perf_counter() - t0))
                cpu[name].append((_children_cpu() - c0) / len(completions) * 1e3)
                rss[name].append(grew)
                if kind in ("correct", "slow_top"):
                    assert rewards == [1.0] * args.n, f"{name}: a reference solution failed"
        for name, r in rates.items():
            print(f"{kind:8s} {name:16s} {statistics.median(r):6.1f} programs/s (median of {args.repeats}), "
                  f"{statistics.median(cpu[name]):5.1f} ms CPU per program, scorer peak-RSS growth "
                  f"{statistics.median(rss[name]):6.1f} MiB")  # fmt: skip
        if len(rates) == 2:
            old, new = (statistics.median(r) for r in rates.values())
            print(f"{kind:8s} new/old throughput ratio {new / old:.2f}")


if __name__ == "__main__":
    main()

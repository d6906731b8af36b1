"""Seed populations vs separate processes: runs x steps per second, MFU, where the time goes, memory.

    python benchmarks/bench_population.py                      # S in 1 2 4 8 16 32, default size and model=small
    python benchmarks/bench_population.py --sizes 1 4 16 --steps 10 --models tiny
    python benchmarks/bench_population.py --designs            # the M1 design micro-benchmark only
    python benchmarks/bench_population.py --in-process --sizes 4 8 --steps 10   # one core, no launcher

For each S, interleaved in one invocation: the same multirun of S seeds (``prorl-bench -m seed=0..S-1``)
through each ``--arms`` launcher: ``joblib`` (2 workers, one torch thread each: S separate runs),
``population`` (``hydra/launcher=population hydra.launcher.n_jobs=2`` with its own plan: each worker at
most ceil(S/2) jobs, as one population) and ``one-population`` (``hydra.launcher.n_jobs=1``: all S seeds
in one population in one process, the plan the launcher made before issue 37's fix), all with the same
warm-up cache (built once first, not timed), the arms interleaved with the order alternating per repeat.
Reported: wall seconds of the whole command (process start-up, base loading, validation, the sweep's
aggregation included), the ratio to joblib, CPU seconds of the command and all its processes (read
from /proc while it runs: what the grid cost the machine, far less sensitive to other load than wall),
runs*steps/s, MFU (the runs' counted FLOPs / wall / (2 x the measured 1-thread fp32 matmul peak)), the
share of each stage in the runs' summed stage times, and peak RSS per member (``mem/peak_rss_mb`` of
each worker process divided by the members it held at once).

``--in-process`` compares, in this one process on one thread, S single runs one after the other
(``trainer.train``) with one population of S (``run_population``), alternating, without validation:
wall seconds and the runs' summed stage times — the launchers' process start-up and scheduling out
of the picture.

``--designs`` times the two batching designs the issue names against a loop over members, on the
default model with 1 thread: (a) ``torch.func.stack_module_state`` + ``functional_call`` + ``vmap``,
(b) ``StackedPolicy`` (batched matmuls over stacked weights), for the teacher-forced forward+backward
of B=64 rows x T=16 and for 7 KV-cached sampling steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = ("rollout", "reward", "old_logprob", "ref_logprob", "update", "reset", "eval")


def _run(args: list[str], sweep: Path, cache: Path) -> tuple[float, float]:
    # the installed entry point, as a user starts it (no PYTHONPATH: the launcher must come from the install)
    cmd = [str(Path(sys.executable).with_name("prorl-bench")), "-m", *args, f"warmup.cache_dir={cache}",
           f"hydra.sweep.dir={sweep}", "hydra.callbacks={}", "progress=false"]  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True, cwd=sweep.parent)
        cpu = _tree_cpu_seconds(proc)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"failed: {' '.join(cmd)}\n{err.read()[-3000:]}")
    return wall, cpu


def _tree_cpu_seconds(proc: subprocess.Popen, every_s: float = 0.2) -> float:
    """CPU seconds (user + system) of ``proc`` and every process below it, until ``proc`` exits.

    What the grid cost the machine, far less sensitive than wall time to other load. Read from
    /proc every ``every_s``: the launcher's loky workers are not always reaped by their parent, so
    getrusage(RUSAGE_CHILDREN) misses them; a process's last ``every_s`` is missed here instead."""
    tick = os.sysconf("SC_CLK_TCK")
    seen: dict[int, float] = {}
    while proc.poll() is None:
        stats = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    f = (d / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                stats[int(d.name)] = (int(f[1]), (int(f[11]) + int(f[12])) / tick)  # ppid, utime + stime
        tree, grew = {proc.pid}, True
        while grew:
            grown = tree | {pid for pid, (ppid, _) in stats.items() if ppid in tree}
            grew, tree = grown != tree, grown
        for pid in tree & stats.keys():
            seen[pid] = max(seen.get(pid, 0.0), stats[pid][1])
        time.sleep(every_s)
    return sum(seen.values())


def _collect(sweep: Path, per_process: int) -> dict[str, float]:
    """Summed FLOPs and stage times over every run's metrics; peak RSS per member."""
    flops, stages, rss = 0.0, dict.fromkeys(STAGES, 0.0), []
    for m in sweep.rglob("metrics.jsonl"):
        for line in m.read_text().splitlines():
            row = json.loads(line)
            flops += row["perf/flops"]
            for s in STAGES:
                stages[s] += row[f"time/{s}"]
        summary = json.loads((m.parent / "summary.json").read_text())
        rss.append(summary["mem/peak_rss_mb"])
    total = sum(stages.values()) or 1.0
    return {"flops": flops, "rss_per_member_mb": max(rss) / per_process,
            **{f"share/{s}": v / total for s, v in stages.items()}}  # fmt: skip


ARMS = {
    "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    # the launcher as a user starts it: its own plan (issue 37: each worker at most joblib's share of jobs)
    "population": ["hydra/launcher=population", "hydra.launcher.n_jobs=2"],
    # the plan before issue 37's fix, for S <= 16: every seed in one population, in one worker process
    "one-population": ["hydra/launcher=population", "hydra.launcher.n_jobs=1"],
}


def _members_per_process(sweep: Path) -> int:
    """Most jobs one worker held at once: its largest population (population_plan.json), else 1."""
    plan = sweep / "population_plan.json"
    if not plan.is_file():
        return 1
    return max(len(u["jobs"]) for u in json.loads(plan.read_text())["units"])


def throughput(
    sizes: list[int],
    models: list[str],
    steps: int,
    extra: list[str],
    repeats: int = 1,
    population_args: tuple[str, ...] = (),
    arms: tuple[str, ...] = ("joblib", "population"),
) -> None:
    import torch

    from prorl_bench.run.accounting import measured_matmul_peak

    torch.set_num_threads(1)
    peak = measured_matmul_peak(torch.device("cpu"), torch.float32)
    print(f"1-thread fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s; steps={steps}; os.cpu_count={os.cpu_count()}; "
          f"load average at start {os.getloadavg()[0]:.1f}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-pop-") as tmp:
        tmp = Path(tmp)
        cache = tmp / "cache"
        for model in models:
            base = [f"model={model}", f"steps={steps}", *extra]
            _run([*base, "seed=0", "steps=1"], tmp / f"warm-{model}", cache)  # build the warm-up base once
            print(f"\n## model={model}\n")
            print("| S | arm | wall s (median) | wall ratio to joblib (per repeat) | CPU s (median) | "
                  "runs·steps/s | MFU | RSS/member MB | stage shares |")  # fmt: skip
            print("|---|---|---|---|---|---|---|---|---|")
            for s in sizes:
                seeds = "seed=" + ",".join(str(i) for i in range(s))
                walls: dict[str, list[float]] = {a: [] for a in arms}
                cpus: dict[str, list[float]] = {a: [] for a in arms}
                res = {}
                for rep in range(repeats):  # interleaved, the order alternating: every arm sees the same load
                    for kind in arms if rep % 2 == 0 else arms[::-1]:
                        sweep = tmp / f"{model}-{kind}-{s}-{rep}"
                        launcher = [*ARMS[kind], *(population_args if kind != "joblib" else ())]
                        wall, cpu = _run([*base, seeds, *launcher], sweep, cache)
                        walls[kind].append(wall)
                        cpus[kind].append(cpu)
                        res[kind] = _collect(sweep, _members_per_process(sweep))
                    done = ", ".join(f"{a} {walls[a][-1]:.1f} s wall {cpus[a][-1]:.1f} s CPU" for a in arms)
                    print(f"S={s} repeat {rep + 1}: {done}; load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
                for kind in arms:
                    w, c, r = statistics.median(walls[kind]), statistics.median(cpus[kind]), res[kind]
                    ratios = "/".join(f"{j / p:.2f}" for j, p in zip(walls["joblib"], walls[kind]))
                    ratio = statistics.median(walls["joblib"]) / w
                    shares = " ".join(f"{k[6:]} {v:.0%}" for k, v in r.items() if k.startswith("share/") and v >= 0.01)
                    mfu = r["flops"] / w / (2 * peak)
                    cells = [kind, f"{w:.1f}", f"{ratio:.2f}× ({ratios})", f"{c:.1f}", f"{s * steps / w:.2f}",
                             f"{mfu:.1%}", f"{r['rss_per_member_mb']:.0f}", shares]  # fmt: skip
                    print(f"| {s} | " + " | ".join(cells) + " |", flush=True)


def in_process(sizes: list[int], steps: int, extra: list[str], model: str) -> None:
    import torch
    from hydra import compose, initialize_config_dir

    from prorl_bench.config import register_configs, to_config
    from prorl_bench.population.runner import MemberJob, run_population
    from prorl_bench.run.trainer import train
    from prorl_bench.searchpath import CONF_DIR

    torch.set_num_threads(1)
    register_configs()
    over = [f"model={model}", f"steps={steps}", "eval_every=100000", "eval.at_start=false", "progress=false", *extra]

    def cfg(seed: int):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return to_config(compose(config_name="config", overrides=[*over, f"seed={seed}"]))

    def sums(dirs: list[Path]) -> dict[str, float]:
        out = dict.fromkeys(("step", "rollout", "update"), 0.0)
        for d in dirs:
            for line in (d / "metrics.jsonl").read_text().splitlines():
                row = json.loads(line)
                for k in out:
                    out[k] += row[f"time/{k}"]
        return out

    print("| S | singles wall s | population wall s | ratio | singles Σrollout s | pop Σrollout s | "
          "singles Σupdate s | pop Σupdate s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-pop-inproc-") as tmp:
        tmp, cache = Path(tmp), Path(tmp) / "cache"
        train(cfg(0), tmp / "warm", cache)  # the warm-up base, built once, not timed
        for s in sizes:
            t0 = time.perf_counter()
            singles = [tmp / f"single-{s}-{i}" for i in range(s)]
            for i, d in enumerate(singles):
                train(cfg(i), d, cache)
            w_single = time.perf_counter() - t0
            t0 = time.perf_counter()
            jobs = [MemberJob(cfg(i), tmp / f"pop-{s}-{i}") for i in range(s)]
            run_population(jobs, cache)
            w_pop = time.perf_counter() - t0
            a, b = sums(singles), sums([j.run_dir for j in jobs])
            cells = [f"{w_single:.1f}", f"{w_pop:.1f}", f"{w_single / w_pop:.2f}×", f"{a['rollout']:.1f}",
                     f"{b['rollout']:.1f}", f"{a['update']:.1f}", f"{b['update']:.1f}"]  # fmt: skip
            print(f"| {s} | " + " | ".join(cells) + " |", flush=True)


def designs(sizes: list[int]) -> None:
    import torch

    torch.set_num_threads(1)
    print("| S | fwd+bwd loop ms | stacked ms | vmap ms | sampling loop ms | stacked ms |")
    print("|---|---|---|---|---|---|")
    for s in sizes:
        print(_design_row(s), flush=True)


def _timed(fn, n: int = 3) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def _design_row(s: int, b: int = 64, t: int = 16, p: int = 7, n_new: int = 7) -> str:
    """One table row: S members, B rows of T tokens (fwd+bwd); P prompt tokens + n_new sampled."""
    import copy

    import torch
    from torch.func import functional_call, stack_module_state, vmap

    from prorl_bench.config import ModelConfig
    from prorl_bench.models.model import TransformerPolicy, positions
    from prorl_bench.population.model import StackedPolicy

    members = []
    for i in range(s):
        torch.manual_seed(i)
        members.append(TransformerPolicy(ModelConfig(), 16))
    stacked = StackedPolicy(members)
    params, bufs = stack_module_state([copy.deepcopy(m) for m in members])
    skeleton = copy.deepcopy(members[0]).to("meta")
    ids = torch.randint(0, 16, (s, b, t))
    mask = torch.ones(s, b, t, dtype=torch.bool)
    cpu = torch.device("cpu")

    def loop():
        for i, m in enumerate(members):
            m(ids[i], mask[i]).square().mean().backward()

    def batched():
        stacked(ids, mask).square().mean().backward()

    def vmapped():
        f = vmap(lambda pr, bf, x, k: functional_call(skeleton, (pr, bf), (x, k)))
        f(params, bufs, ids, mask).square().mean().backward()

    @torch.no_grad()
    def sample_loop():
        for i, m in enumerate(members):
            c = m.new_cache(b, p + n_new, cpu)
            logits = m.forward_cached(ids[i, :, :p], mask[i, :, :p], positions(mask[i, :, :p]), c)[:, -1]
            nxt_pos = torch.full((b, 1), p)
            for _ in range(n_new):
                tok = torch.multinomial(torch.softmax(logits, -1), 1)
                logits = m.forward_cached(tok, mask[i, :, :1], nxt_pos, c)[:, -1]
                nxt_pos = nxt_pos + 1

    @torch.no_grad()
    def sample_stacked():
        c = stacked.new_cache(b, p + n_new, cpu)
        logits = stacked.forward_cached(ids[:, :, :p], mask[:, :, :p], positions(mask[:, :, :p]), c)[:, :, -1]
        nxt_pos = torch.full((s, b, 1), p)
        for _ in range(n_new):
            tok = torch.multinomial(torch.softmax(logits, -1).view(s * b, -1), 1).view(s, b, 1)
            logits = stacked.forward_cached(tok, mask[:, :, :1], nxt_pos, c)[:, :, -1]
            nxt_pos = nxt_pos + 1

    cells = [_timed(f) for f in (loop, batched, vmapped, sample_loop, sample_stacked)]
    return f"| {s} | " + " | ".join(f"{c:.0f}" for c in cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--models", nargs="+", default=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--designs", action="store_true", help="only the design micro-benchmark")
    ap.add_argument("--in-process", action="store_true", help="singles vs a population in this process")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repetitions per S (medians reported)")
    ap.add_argument("--population-arg", action="append", default=[], help="extra override for the population arms")
    ap.add_argument(
        "--arms",
        nargs="+",
        default=["joblib", "population"],
        choices=sorted(ARMS),
        help="launcher arms, joblib first (one-population: the plan before issue 37's fix)",
    )
    ap.add_argument("extra", nargs="*", help="more overrides for every run (e.g. algo.group_size=4)")
    a = ap.parse_args()
    if a.designs:
        designs([s for s in a.sizes if s in (1, 8, 32)] or a.sizes)
        return
    if a.in_process:
        for model in a.models:
            print(f"\n## model={model}\n")
            in_process(a.sizes, a.steps, a.extra, model)
        return
    throughput(a.sizes, a.models, a.steps, a.extra, a.repeats, tuple(a.population_arg), tuple(a.arms))


if __name__ == "__main__":
    main()

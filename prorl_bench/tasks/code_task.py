"""``task=code``: the policy writes a Python function; unit tests run it in the sandbox.

Problems come from JSONL files (one object per line, loaded with ``json`` only — nothing in a data
file is executed by the bench itself). The schema, close to MBPP / HumanEval::

    {"id": "add_two",                      # unique across the train and held-out files
     "prompt": "Return the sum of ...",    # the natural-language specification
     "entry_point": "add_two",             # the function the tests call
     "signature": "def add_two(a, b):",    # optional; else read from "solution", else the name
     "tests": [{"args": [1, 2], "expected": 3}, ...],   # positional arguments and the JSON result
     "solution": "def add_two(a, b): ...", # optional reference (tests check every shipped one)
     "difficulty": "easy"}                 # optional label: validation reports per label

A sample's program is extracted from the completion (the last fenced ```python block, else a
``<code></code>`` span, else the whole completion) and run in the sandbox (``sandbox.py``): the program's top
level runs once, then each test calls the entry point in a fresh fork of that state; only the JSON-encoded
return value comes back, over a pipe made for that call, which the program's output never reaches. The
expected values never enter the sandbox: this process compares each result as it arrives
(``code_compare.py``: strict types, a tolerance only for float expectations, total) and drops it. Printing
"passed", forging result lines or exiting early earns nothing (tests/tasks/test_sandbox_hostile.py). The isolation
in force is printed when the task is built; below ``full`` with every layer (cgroup, seccomp) the task
refuses to run unless ``task.allow_weak_isolation=true``.

Reward: fraction of tests passed (``task.reward=partial``) or 1 only if all pass (``exact``);
success = all pass. Each sample gets exactly one failure class (``FAIL_CLASSES``), logged per step as
``code/fail/<class>`` (fractions of the rollout) and written with the validation samples. ``score_many``
never raises for one sample's program: a failure of the scorer itself on a sample is that sample's
``scorer_error``. It raises ``SandboxBroken`` (the run stops, resumable from its last checkpoint) when the
sandbox cannot be set up (scratch directory, cgroup, uid counter, seccomp filter: the message names it) or
when more than ``task.max_scorer_error_rate`` of the batch is ``scorer_error``.
"""

from __future__ import annotations

import math
import random
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prorl_bench.config import CodeTaskConfig, PromptStyle, TaskConfig
from prorl_bench.registry import TASKS, ConfigError
from prorl_bench.tasks.base import Problem, jsonl_objects
from prorl_bench.tasks.code_compare import Expected, canonical
from prorl_bench.tasks.sandbox import (
    FAIL_CLASSES,
    Isolation,
    SandboxBroken,
    SandboxLimits,
    SandboxResult,
    default_hidden,
    isolation,
    isolation_level,
    run_many,
)

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "code"
# One class per sample (sandbox.FAIL_CLASSES). ok: every test passed; no_code: nothing to run;
# syntax_error: the program does not compile; timeout / memory: the sandbox stopped it (the runner's clock, or
# its CPU limit as the sample's cgroup counted it; the sample's memory cgroup's counters); crashed: its top
# level died of a signal no limit explains (a segfault, a signal it sent itself); output_limit: it wrote more
# than the cap to stdout or stderr, or returned a value larger than the cap; exception: it raised (at top
# level, or in at least one test), exited or died before a test returned, or broke the runner's protocol;
# wrong_answer: it ran every test without raising and at least one result differs; scorer_error: the scorer
# failed on this sample (a bug, reported on stderr), which then gets 0 (above max_scorer_error_rate of a
# batch the run stops; a sandbox that cannot be set up stops it at once: SandboxBroken). Every class comes
# from what the sandbox observed, never from the program's words or signals (an exception named MemoryError
# is an exception, a self-sent SIGXCPU is not a timeout).
INSTRUCTION = "Reply with the function in a ```python code block."
REQUIRED = {"id": str, "prompt": str, "entry_point": str, "tests": list}

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_CODE_TAG = re.compile(r"<code>(.*?)</code>", re.DOTALL | re.IGNORECASE)
_DEF = re.compile(r"^def\s+\w+\s*\(.*?\)\s*(?:->[^:]*)?:", re.MULTILINE)


@dataclass(frozen=True)
class CodeProblem(Problem):
    """A Problem with its tests (the target string is unused: the verifier runs the tests)."""

    id: str = ""
    entry_point: str = ""
    tests: tuple = field(default=(), compare=False, hash=False, repr=False)
    solution: str = field(default="", compare=False, hash=False, repr=False)


def load_problems(path: Path) -> list[dict[str, Any]]:
    """Parse and check a problem file; every error names the file and line."""
    rows = []
    for where, row in jsonl_objects(path):
        for key, typ in REQUIRED.items():
            if not isinstance(row.get(key), typ):
                raise ConfigError(f"{where}: field {key!r} missing or not a {typ.__name__}")
        if not row["entry_point"].isidentifier():
            raise ConfigError(f"{where}: entry_point {row['entry_point']!r} is not a Python identifier")
        if not row["tests"]:
            raise ConfigError(f"{where}: 'tests' is empty")
        for t in row["tests"]:
            if not (isinstance(t, dict) and isinstance(t.get("args"), list) and "expected" in t):
                raise ConfigError(f"{where}: every test needs 'args' (a list) and 'expected'")
            try:
                canonical(t["expected"])
            except ValueError:
                raise ConfigError(f"{where}: an 'expected' value holds NaN or Infinity (nothing can match)") from None
        rows.append(row)
    if not rows:
        raise ConfigError(f"{path}: no problems")
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{path}: duplicate problem ids {sorted({i for i in ids if ids.count(i) > 1})}")
    return rows


def extract_program(completion: str) -> str | None:
    """The program in a completion: the last fenced python block, else a <code> span, else the text."""
    blocks = _FENCE.findall(completion)
    if blocks:
        return blocks[-1]
    tags = _CODE_TAG.findall(completion)
    if tags:
        return tags[-1]
    text = completion.strip().strip("`")
    return text or None


def judge(result: SandboxResult, n_tests: int) -> tuple[int, str]:
    """(tests passed, failure class) of one sandboxed run judged with ``check``: only the calls' return
    values count, and the class comes from what the sandbox observed."""
    calls = list(result.calls) + [None] * (n_tests - len(result.calls))
    passed = sum(1 for c in calls if c is not None and c.get("passed") is True)
    if result.status not in ("ok", "exception"):  # syntax, timeout, memory, crashed, output_limit
        return passed, result.status
    if result.status == "exception" or None in calls:  # crashed or exited before a call returned
        return passed, "exception"
    if passed == n_tests:
        return passed, "ok"
    if any("error" in c for c in calls):
        return passed, "exception"
    return passed, "wrong_answer"


def _check(tests: Sequence[dict]) -> Callable[[int, bytes], bool]:
    """Judges call ``i``'s raw result against test ``i`` (``Expected`` built on first use)."""
    built: dict[int, Expected] = {}

    def check(i: int, payload: bytes) -> bool:
        if i not in built:
            built[i] = Expected(tests[i]["expected"])
        return built[i].matches(payload)

    return check


class CodeTask:
    """Problems from the train and held-out files; rewards from sandboxed unit tests."""

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        self.c = cfg.params  # CodeTaskConfig: the task's own keys (task.timeout_s, task.workers, ...)
        self.name = cfg.name
        self.chat = self.c.prompt_style == PromptStyle.chat
        train_path = Path(self.c.path) if self.c.path else DATA_DIR / "train.jsonl"
        val_path = Path(self.c.val_path) if self.c.val_path else DATA_DIR / "val.jsonl"
        self._train = [self._problem(r) for r in load_problems(train_path)]
        self._val_all = [self._problem(r) for r in load_problems(val_path)]
        overlap = {p.id for p in self._train} & {p.id for p in self._val_all}
        if overlap:
            ids = sorted(overlap)
            raise ConfigError(f"invalid config value task.val_path: problem ids also in training: {ids}")
        self._val_ids = {p.id for p in self._val_all}
        self.limits = SandboxLimits(wall_s=self.c.timeout_s, cpu_s=max(1, math.ceil(self.c.timeout_s)),
                                    memory_bytes=self.c.memory_mb * 2**20)  # fmt: skip
        self.isolation = check_isolation(self.c.allow_weak_isolation)
        # the problem files hold the expected answers: hidden from the sample even inside a bound tree
        self.hidden = [*default_hidden(), str(train_path.resolve().parent), str(val_path.resolve().parent)]
        self.max_prompt_len = 1 + max(len(p.prompt) for p in self._train + self._val_all)
        if self.chat:
            from prorl_bench.tasks.reasoning_gym_task import CHAT_TEMPLATE_ALLOWANCE

            self.max_prompt_len += CHAT_TEMPLATE_ALLOWANCE
        self.max_completion_len = self.c.max_completion_tokens

    def _problem(self, row: dict[str, Any]) -> CodeProblem:
        sig = row.get("signature") or next(iter(_DEF.findall(row.get("solution", ""))), None)
        head = f"Write a Python function `{sig or row['entry_point']}`"
        prompt = f"{head}: {row['prompt']} {INSTRUCTION}"
        return CodeProblem(
            prompt=prompt, target="", difficulty=str(row.get("difficulty", "")), id=row["id"],
            entry_point=row["entry_point"], tests=tuple(row["tests"]), solution=row.get("solution", ""),
        )  # fmt: skip

    # -- the Task interface
    def val_set(self) -> list[Problem]:
        return list(self._val_all[: self.cfg.val_size])

    def is_val(self, problem: Problem) -> bool:
        return getattr(problem, "id", None) in self._val_ids

    def sample_train(self, rng: random.Random, n: int) -> list[Problem]:
        return [self._train[rng.randrange(len(self._train))] for _ in range(n)]

    def score(self, completion: str, problem: Problem) -> tuple[float, bool]:
        reward, success, _ = self.score_many([completion], [problem])
        return reward[0], success[0]

    def score_many(
        self, completions: Sequence[str], problems: Sequence[Problem]
    ) -> tuple[list[float], list[bool], list[dict[str, Any]]]:
        """Run every completion's program against its problem's tests, in parallel sandboxes.
        Returns rewards, successes and per-sample info ({"fail": class, "passed": k, "tests": n})."""
        n = len(problems)
        fails = ["no_code"] * n
        passed = [0] * n
        programs = [extract_program(c) for c in completions]
        todo = [i for i, prog in enumerate(programs) if prog is not None]

        def on_result(j: int, result: SandboxResult | BaseException) -> None:
            i = todo[j]
            try:
                if isinstance(result, BaseException):
                    raise result
                passed[i], fails[i] = judge(result, len(problems[i].tests))
            except Exception as e:  # noqa: BLE001 (this sample's failure, never the batch's)
                passed[i], fails[i] = 0, "scorer_error"
                print(f"[prorl-bench] task=code: scorer error on sample {i} ({problems[i].id}): "
                      f"{type(e).__name__}: {str(e)[:500]}", file=sys.stderr)  # fmt: skip

        calls = [[t["args"] for t in problems[i].tests] for i in todo]
        checks = [_check(problems[i].tests) for i in todo]
        run_many([programs[i] for i in todo], self.limits, self.c.workers, calls,
                 [problems[i].entry_point for i in todo], hide=self.hidden, checks=checks, on_result=on_result,
                 keep_stdout=0)  # fmt: skip
        # a SandboxBroken (the sandbox cannot be set up) has raised above: the run stops
        check_scorer_errors(fails, self.c.max_scorer_error_rate)
        rewards, success, infos = [], [], []
        for i, p in enumerate(problems):
            ok = fails[i] == "ok"
            rewards.append(float(ok) if self.cfg.reward.value == "exact" else passed[i] / len(p.tests))
            success.append(ok)
            infos.append({"fail": fails[i], "passed": passed[i], "tests": len(p.tests)})
        return rewards, success, infos

    @staticmethod
    def step_metrics(infos: Sequence[dict[str, Any]]) -> dict[str, float]:
        """``code/fail/<class>``: the fraction of samples in each failure class (every class, so
        the columns are stable), and ``code/tests_passed``: the mean fraction of tests passed."""
        n = max(1, len(infos))
        out = {f"code/fail/{c}": sum(i["fail"] == c for i in infos) / n for c in FAIL_CLASSES}
        out["code/tests_passed"] = sum(i["passed"] / i["tests"] for i in infos) / n
        return out


def check_scorer_errors(fails: Sequence[str], max_rate: float) -> None:
    """Raise SandboxBroken when more than ``max_rate`` of a scored batch is ``scorer_error``: the scorer or
    the sandbox is failing, and training on those zeros would make the run quietly wrong."""
    n = sum(f == "scorer_error" for f in fails)
    if fails and n / len(fails) > max_rate:
        raise SandboxBroken(f"task=code: {n} of {len(fails)} samples of this batch were scorer_error (the scorer "
                            f"failed, not the program: see the errors above), more than "
                            f"task.max_scorer_error_rate={max_rate}; the run stops")  # fmt: skip


@TASKS.register("code")
def _code(cfg: TaskConfig, params: CodeTaskConfig) -> CodeTask:
    return CodeTask(cfg)  # params is cfg.params, bound when the config was validated


def describe_isolation() -> str:
    """Which sandbox isolation is in force here (probed once), for the run's start event."""
    return isolation_level()


def check_isolation(allow_weak: bool) -> Isolation:
    """The isolation in force, printed; below ``full`` with every layer a ConfigError unless ``allow_weak``
    (then a warning saying what a program can reach)."""
    iso = isolation()
    if iso.level == "full" and not iso.missing:
        print("[prorl-bench] task=code sandbox isolation: full (private root, no network, own pid namespace, "
              "fresh uid, cgroup and seccomp filter per sample)", file=sys.stderr)  # fmt: skip
        return iso
    where = f"{iso.level!r}, not 'full'" if iso.level != "full" else "'full'"
    lacks = f"; missing layers: {'; '.join(iso.missing)}" if iso.missing else ""
    msg = (f"task=code sandbox isolation here is {where} ({iso.reason or 'namespaces: ok'}{lacks}); a program "
           f"could reach {iso.exposed()}")  # fmt: skip
    if not allow_weak:
        raise ConfigError(f"invalid config value task.allow_weak_isolation=false: {msg}. Run as root with "
                          "util-linux unshare, a cgroup hierarchy with the memory, pids and cpu controllers and "
                          "libseccomp, or accept this with task.allow_weak_isolation=true")  # fmt: skip
    print(f"[prorl-bench] WARNING: {msg} (accepted: task.allow_weak_isolation=true)", file=sys.stderr)
    return iso

"""Verifiable sequence tasks and the shared character-level tokenizer.

Every task turns a random input of ``min_len..max_len`` symbols into a prompt string and a target
string. A completion is scored by an exact-match or a partial-credit verifier. The problem space is
split deterministically (CRC32 of the prompt) into a training part and a held-out validation part,
so validation never sees a training prompt.
"""

from __future__ import annotations

import functools
import json
import random
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prorl_bench.config import RewardKind, TaskConfig
from prorl_bench.config.builtin_options import Lengths, symbol_lengths
from prorl_bench.models.tokenizers import CharTokenizer  # noqa: F401  (re-exported: tasks' prompts use it)
from prorl_bench.registry import TASKS, ConfigError, build_task


@dataclass(frozen=True)
class Problem:
    """A prompt, its target, and a difficulty label validation reports by (e.g. "len4")."""

    prompt: str
    target: str
    difficulty: str = ""


def exact_reward(completion: str, target: str) -> float:
    return 1.0 if completion == target else 0.0


def partial_reward(completion: str, target: str) -> float:
    """Fraction of positions that match, normalised by the longer of the two strings."""
    n = max(len(completion), len(target))
    if n == 0:
        return 1.0
    hits = sum(a == b for a, b in zip(completion, target))
    return hits / n


class Task:
    """A verifiable task: problem generator, verifier and a deterministic held-out split."""

    def __init__(
        self,
        cfg: TaskConfig,
        tag: str,
        make_input: Callable[[random.Random, int], tuple[str, str]],
        lengths: Lengths,
    ) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self._tag = tag
        self._make_input = make_input
        self.max_prompt_len, self.max_completion_len = lengths(cfg)  # BOS and EOS included
        self._reward_fn = exact_reward if cfg.reward == RewardKind.exact else partial_reward
        self._val: list[Problem] | None = None

    # -- problems
    def _problem(self, rng: random.Random) -> Problem:
        n = rng.randint(self.cfg.min_len, self.cfg.max_len)
        x, target = self._make_input(rng, n)
        return Problem(prompt=f"{self._tag}{x}=", target=target, difficulty=f"len{n}")

    def is_val(self, problem: Problem) -> bool:
        return (zlib.crc32(problem.prompt.encode()) % 10_000) < self.cfg.val_fraction * 10_000

    def sample_train(self, rng: random.Random, n: int) -> list[Problem]:
        """n training problems (never from the validation split)."""
        out: list[Problem] = []
        tries = 0
        while len(out) < n:
            p = self._problem(rng)
            tries += 1
            if not self.is_val(p):
                out.append(p)
            elif tries > 1000 * n:
                raise ConfigError(f"task {self.name}: training split is empty; lower task.val_fraction")
        return out

    def val_set(self) -> list[Problem]:
        """The fixed held-out validation problems (unique, up to task.val_size)."""
        if self._val is None:
            rng = random.Random(0xC0FFEE)
            seen: dict[str, Problem] = {}
            since_new = 0  # small problem spaces run dry: stop after 5000 draws without a new one
            while len(seen) < self.cfg.val_size and since_new < 5000:
                p = self._problem(rng)
                since_new += 1
                if self.is_val(p) and p.prompt not in seen:
                    seen[p.prompt] = p
                    since_new = 0
            if not seen:
                raise ConfigError(
                    f"task {self.name}: no validation problems with min_len={self.cfg.min_len}, "
                    f"max_len={self.cfg.max_len}; raise task.val_fraction or the lengths"
                )
            self._val = list(seen.values())
        return self._val

    # -- verification
    def reward(self, completion: str, target: str) -> float:
        return self._reward_fn(completion, target)

    def success(self, completion: str, target: str) -> bool:
        return completion == target

    def score(self, completion: str, problem: Problem) -> tuple[float, bool]:
        """(reward, success) of one completion; tasks whose verifier needs more than the target
        string (reasoning-gym entries) override this."""
        return self.reward(completion, problem.target), self.success(completion, problem.target)


def symbol_task(
    name: str,
    tag: str,
    prompt_len: Callable[[int], int] | None = None,
    completion_len: Callable[[int], int] | None = None,
    solve: Callable[[str], str] | None = None,
    params: type | None = None,
) -> Callable[[Callable[..., tuple[str, str]]], Callable[..., tuple[str, str]]]:
    """Register a generator ``(rng, n) -> (input, target)`` as task ``name``: prompts are
    ``<tag><input>=`` (``tag``: one character of the tokenizer's alphabet, unique per task), and
    ``prompt_len(n)``/``completion_len(n)`` bound the prompt (tag and "=" included) and the target
    for ``n`` = task.max_len (a task declared in config/builtin_options.py has them there: leave them
    out). ``solve(input) -> target`` states the answer independently of the generator (registry
    metadata: the tests check every generated target against it). ``task.name=name`` then selects it;
    nothing else is edited. ``params``: a dataclass of the task's parameters (flat keys
    ``task.<name>``); the generator is then called as ``fn(rng, n, params=<instance>)``, bound once
    when the task is built. Its ``--help`` line is the generator's docstring (or the declaration's)."""
    if solve is None:
        raise ValueError(f"task {name!r}: solve= states the answer to an input (the tests check the generator by it)")
    if (prompt_len is None) != (completion_len is None):
        raise ValueError(f"task {name!r}: give both prompt_len and completion_len, or neither (declared lengths)")
    own = {} if prompt_len is None else {"lengths": symbol_lengths(prompt_len, completion_len)}

    def deco(fn: Callable[..., tuple[str, str]]) -> Callable[..., tuple[str, str]]:
        def factory(cfg: TaskConfig, params: Any = None) -> Task:
            gen = fn if params is None else functools.partial(fn, params=params)
            return Task(cfg, tag, gen, TASKS.hook(name, "lengths"))

        factory.__doc__ = fn.__doc__
        TASKS.add(name, factory, symbols=True, solve=solve, params=params, **own)
        if TASKS.hook(name, "lengths") is None:
            raise ValueError(f"task {name!r}: no prompt lengths (give prompt_len and completion_len)")
        return fn

    return deco


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def _number(rng: random.Random, n: int) -> int:
    lo = 0 if n == 1 else 10 ** (n - 1)
    return rng.randint(lo, 10**n - 1)


# the built-in symbol tasks: declared (description, lengths) in config/builtin_options.py
@symbol_task("reverse_digits", "R", solve=lambda x: x[::-1])
def _reverse(rng: random.Random, n: int) -> tuple[str, str]:
    x = _digits(rng, n)
    return x, x[::-1]


@symbol_task("copy", "C", solve=lambda x: x)
def _copy(rng: random.Random, n: int) -> tuple[str, str]:
    x = _digits(rng, n)
    return x, x


@symbol_task("sort_digits", "S", solve=lambda x: "".join(sorted(x)))
def _sort(rng: random.Random, n: int) -> tuple[str, str]:
    x = _digits(rng, n)
    return x, "".join(sorted(x))


@symbol_task("parity", "P", solve=lambda x: str(x.count("1") % 2))
def _parity(rng: random.Random, n: int) -> tuple[str, str]:
    x = "".join(rng.choice("01") for _ in range(n))
    return x, str(x.count("1") % 2)


@symbol_task("add", "A", solve=lambda x: str(sum(map(int, x.split("+")))))
def _add(rng: random.Random, n: int) -> tuple[str, str]:
    a, b = _number(rng, n), _number(rng, n)
    return f"{a}+{b}", str(a + b)


def make_task(cfg: TaskConfig) -> Task:
    """Build the task named by ``cfg.name`` (a registered task; ConfigError lists the allowed names),
    with its ``task.params`` when it declares them. Lengths: symbols in the input (per operand for add)."""
    return build_task(cfg)


def jsonl_objects(path: str | Path, expected: str = "a JSON object") -> Iterator[tuple[str, dict]]:
    """(``"FILE:LINE"``, object) for every non-blank line of a user's problem file, read with ``json`` only
    (no code runs from data). A line that is not JSON, or not an object, is a ConfigError naming file and
    line; ``expected`` describes the object in that message."""
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: expected {expected}")
        yield where, row

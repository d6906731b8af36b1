"""``task=math_jsonl``: your own math problems from a JSONL file, prompted and scored as ``task=gsm``.

File format (``task.path``; ``task.val_path`` for a separate held-out file), one JSON object a line::

    {"question": "Tom has 3 apples and buys 4 more. How many does he have?", "answer": "7"}
    {"question": "...", "answer": 1234, "difficulty": "hard"}     # answer: a string or a number;
                                                                     # difficulty: optional label
Blank lines are skipped; anything else that is not such an object is a ConfigError naming the file
and line. The files are read with ``json`` only.

Prompts: the question plus ``answers.CHAT_INSTRUCTION`` ("Give your final answer inside
<answer></answer> tags."), rendered through the chat template (``task.chat_template`` or the
tokenizer's own), so ``model=hf_causal_lm`` is required.

Scoring: the strict extraction of ``task=gsm`` (``answers.strict_answer``: the last ``<answer>`` tag,
else the last "Answer:" line, else no answer and reward 0). A numeric answer is compared as a number
(``1,234`` = ``1234``); any other answer must equal the target with whitespace runs collapsed.
Reward 1 or 0 (``task.reward=exact``); success = reward 1.

Split: with ``task.val_path`` the held-out problems are that file's (a question in both files is a
ConfigError); without it, a question is held out when the CRC32 of its text falls in the
``task.val_fraction`` share — deterministic, and independent of the file's order. Completion budget:
``MAX_COMPLETION_TOKENS`` unless ``algo.max_new_tokens`` is set.
"""

from __future__ import annotations

import functools
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

from prorl_bench.config import MathJsonlConfig, RewardKind, TaskConfig
from prorl_bench.registry import TASKS, ConfigError
from prorl_bench.tasks.answers import (
    CHAT_INSTRUCTION,
    CHAT_TEMPLATE_ALLOWANCE,
    is_numeric,
    numbers_equal,
    strict_answer,
)
from prorl_bench.tasks.base import Problem, jsonl_objects

MAX_COMPLETION_TOKENS = 256  # as task=gsm: room to reason before the tagged answer


@dataclass(frozen=True)
class MathProblem(Problem):
    """A Problem whose target is the file's answer (as text) and whose ``question`` has no instruction."""

    question: str = ""


def _text(value: object) -> str | None:
    """An answer as text: strings as they are, numbers without a trailing ``.0``; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))
    if isinstance(value, float):
        return repr(value)
    return value if isinstance(value, str) else None


def load_problems(path: str | Path) -> list[MathProblem]:
    """Parse and check a problem file (format: module docstring); every error names file and line."""
    p = Path(path).expanduser()
    return list(_load(str(p.resolve()), *_stamp(p)))


def _stamp(p: Path) -> tuple[int, int]:
    try:
        st = p.stat()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read ({e.strerror})") from None
    return st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=8)  # config validation and the run both read the file: once per version
def _load(path: str, mtime_ns: int, size: int) -> tuple[MathProblem, ...]:
    out: list[MathProblem] = []
    seen: dict[str, int] = {}
    for where, row in jsonl_objects(path, 'an object {"question": ..., "answer": ...}'):
        question, answer = row.get("question"), _text(row.get("answer"))
        if not isinstance(question, str) or not question.strip():
            raise ConfigError(f"{where}: field 'question' missing or not a non-empty string")
        if answer is None or not answer.strip():
            raise ConfigError(f"{where}: field 'answer' missing or not a non-empty string or number")
        difficulty = row.get("difficulty", "")
        if not isinstance(difficulty, str):
            raise ConfigError(f"{where}: field 'difficulty' must be a string")
        unknown = sorted(set(row) - {"question", "answer", "difficulty"})
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {unknown}; allowed: question, answer, difficulty")
        question = " ".join(question.split())
        if question in seen:
            raise ConfigError(f"{where}: the same question as line {seen[question]}")
        seen[question] = int(where.rsplit(":", 1)[1])
        prompt = f"{question} {CHAT_INSTRUCTION}"
        out.append(MathProblem(prompt=prompt, target=answer.strip(), difficulty=difficulty, question=question))
    if not out:
        raise ConfigError(f"{path}: no problems (one JSON object per line)")
    return tuple(out)


def _held_out(question: str, fraction: float) -> bool:
    return (zlib.crc32(question.encode()) % 10_000) < fraction * 10_000


def split(cfg: TaskConfig) -> tuple[list[MathProblem], list[MathProblem]]:
    """(training problems, held-out problems) of ``cfg`` (see the module docstring); both non-empty."""
    files = cfg.params  # MathJsonlConfig: task.path, task.val_path
    if files.path is None:
        raise ConfigError("invalid config value task.path=None: task=math_jsonl reads your problems from a JSONL file")
    rows = load_problems(files.path)
    if files.val_path is not None:
        train, val = rows, load_problems(files.val_path)
        both = sorted({p.question for p in train} & {p.question for p in val})
        if both:
            raise ConfigError(f"invalid config value task.val_path={files.val_path!r}: questions also in task.path: "
                              f"{both[:3]}{' ...' if len(both) > 3 else ''}")  # fmt: skip
    else:
        train = [p for p in rows if not _held_out(p.question, cfg.val_fraction)]
        val = [p for p in rows if _held_out(p.question, cfg.val_fraction)]
    where = "task.val_path" if files.val_path is not None else f"task.val_fraction={cfg.val_fraction} of task.path"
    if not val:
        raise ConfigError(f"task=math_jsonl: no held-out problems ({where}); add problems or raise task.val_fraction")
    if not train:
        raise ConfigError(f"task=math_jsonl: no training problems in task.path={files.path!r} after the held-out split")
    return train, val


def check_config(cfg: TaskConfig) -> None:
    """Config-time check of the keys this task owns: the files parse and the split is non-empty."""
    if cfg.reward != RewardKind.exact:
        raise ConfigError(f"invalid config value task.reward={cfg.reward.value}: allowed exact with task=math_jsonl")
    for key in ("path", "val_path"):
        value = getattr(cfg.params, key)
        if (value is not None or key == "path") and not (value and Path(value).expanduser().is_file()):
            raise ConfigError(
                f"invalid config value task.{key}={value!r}: allowed an existing JSONL file of "
                '{"question": ..., "answer": ...} lines' + (" (or null)" if key == "val_path" else "")
            )
    split(cfg)


class MathJsonlTask:
    """The Task interface (sample_train, val_set, is_val, score, max_*_len) over a JSONL file."""

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self._train, val = split(cfg)  # reads cfg.params (MathJsonlConfig)
        self._val = val[: cfg.val_size]
        self._val_questions = {p.question for p in val}
        longest = max(len(p.prompt) for p in self._train + val)  # characters bound tokens (+ BOS)
        self.max_prompt_len = 1 + longest + CHAT_TEMPLATE_ALLOWANCE
        self.max_completion_len = MAX_COMPLETION_TOKENS

    def val_set(self) -> list[Problem]:
        return list(self._val)

    def is_val(self, problem: Problem) -> bool:
        return getattr(problem, "question", None) in self._val_questions

    def sample_train(self, rng: random.Random, n: int) -> list[Problem]:
        """n training problems, uniformly with replacement."""
        return [self._train[rng.randrange(len(self._train))] for _ in range(n)]

    def score(self, completion: str, problem: Problem) -> tuple[float, bool]:
        answer = strict_answer(completion, problem.target)
        if answer is None:  # no <answer> tag and no "Answer:" line: no answer was given
            return 0.0, False
        if is_numeric(problem.target):
            ok = numbers_equal(answer, problem.target)
        else:
            ok = " ".join(answer.split()) == " ".join(problem.target.split())
        return float(ok), ok


EXAMPLE = Path(__file__).resolve().parents[1] / "data" / "math" / "example.jsonl"  # package data: 32 problems


def main(argv: list[str] | None = None) -> int:
    """``python -m prorl_bench.tasks.math_jsonl_task FILE [VAL_FILE]``: check a problem file (line-numbered
    errors) and show its split; ``--example``: print the path of the shipped example file."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m prorl_bench.tasks.math_jsonl_task", description=main.__doc__)
    ap.add_argument("path", nargs="?", help="a JSONL problem file to check")
    ap.add_argument("val_path", nargs="?", help="a held-out JSONL file (else a hash split of PATH)")
    ap.add_argument("--val-fraction", type=float, default=0.25, help="held-out share without VAL_PATH")
    ap.add_argument("--example", action="store_true", help="print the shipped example's path and exit")
    args = ap.parse_args(argv)
    if args.example or args.path is None:
        print(EXAMPLE)
        return 0
    try:  # TaskConfig's own check reads the files (config time, as a run does)
        files = MathJsonlConfig(path=args.path, val_path=args.val_path)
        cfg = TaskConfig(name="math_jsonl", val_fraction=args.val_fraction, params=files)
        train, val = split(cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.path}: {len(train)} training problems, {len(val)} held out")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# your own problems: owns task.path / task.val_path (its params, MathJsonlConfig: config/builtin_options.py);
# check_config reads the files when the config is validated
@TASKS.register("math_jsonl", check_config=check_config)
def _math_jsonl(cfg: TaskConfig, params: MathJsonlConfig) -> MathJsonlTask:
    return MathJsonlTask(cfg)  # params is cfg.params, bound when the config was validated

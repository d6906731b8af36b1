"""``task=reasoning_gym``: procedural generators from the ``reasoning-gym`` package as a Task.

Each problem is one entry of a ``reasoning_gym`` dataset (question, answer, metadata); the reward is
the package's own ``score_answer(completion, entry)`` in [0, 1] and success means a score of 1.

Split: training problems come from a dataset seeded ``train_seed`` (a random index per draw),
validation problems from a dataset seeded ``val_seed``; a training draw whose prompt is also a
validation prompt is rejected, so validation is held out by seed *and* by content.

Prompts: ``compact`` builds a short prompt from the generator's metadata for generators known here
(``spell_backward``, ``basic_arithmetic``, ``number_sorting``, ``chain_sum``) so a character-level
policy with a 64-token context can learn it, and falls back to the question text for others;
``question`` always uses the full question; ``chat`` adds an answer-format instruction
(``CHAT_INSTRUCTION``), the HF tokenizer renders it through the model's chat template, and the answer
is extracted from the completion (``extract_answer``) before the package scores it — the format a
GSM8K-style math task on an instruction-tuned model needs (e.g. ``generators=[gsm_symbolic]``).
Whitespace runs become one space; problems with
characters outside printable ASCII or longer than ``max_prompt_chars``/``max_answer_chars`` are
skipped (the limits are what the completion budget and the config's context check rely on).

Requires the ``reasoning`` extra (``pip install 'prorl-bench[reasoning]'``); the generators need
no network (their word lists ship inside the package).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prorl_bench.config import ConfigError, PromptStyle, ReasoningGymConfig, TaskConfig
from prorl_bench.extras import require_extra
from prorl_bench.registry import TASKS, config_check
from prorl_bench.tasks.answers import (  # noqa: F401  (CHAT_*, extract_answer: re-exported, the task=gsm names)
    CHAT_INSTRUCTION,
    CHAT_TEMPLATE_ALLOWANCE,
    extract_answer,
    strict_answer,
)
from prorl_bench.tasks.base import Problem


@dataclass(frozen=True)
class RGProblem(Problem):
    """A Problem that keeps its reasoning-gym entry (the verifier needs the metadata)."""

    generator: str = ""
    entry: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)


def _compact_spell_backward(e: dict[str, Any]) -> str:
    return f"SB:{e['metadata']['word']}="


def _compact_basic_arithmetic(e: dict[str, Any]) -> str:
    return f"BA:{e['metadata']['expression']}="


def _compact_number_sorting(e: dict[str, Any]) -> str:
    m = e["metadata"]
    arrow = "<" if m["direction"] == "ascending" else ">"
    return f"NS{arrow}:{','.join(m['original_numbers'])}="


def _compact_chain_sum(e: dict[str, Any]) -> str:
    return f"CS:{e['metadata']['expression']}="


COMPACT: dict[str, Callable[[dict[str, Any]], str]] = {
    "spell_backward": _compact_spell_backward,
    "basic_arithmetic": _compact_basic_arithmetic,
    "number_sorting": _compact_number_sorting,
    "chain_sum": _compact_chain_sum,
}

_PRINTABLE = re.compile(r"^[\x20-\x7e]*$")

# Arguments a generator gets unless task.generator_args names it: sizes whose compact
# prompts and answers fit the character-level policy. Kept here, not in the YAML, so that choosing
# other generators never trips over arguments the user did not write.
GENERATOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "spell_backward": {"min_word_len": 3, "max_word_len": 5},
}


def _import_rg():
    return require_extra("reasoning_gym", "task.name=reasoning_gym", "reasoning")


def check_generators(names: list[str]) -> None:
    """Every name is a reasoning-gym dataset; else a ConfigError with the closest names (difflib)."""
    import difflib

    known = sorted(_import_rg().factory.DATASETS)
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}?" if close else f"allowed: {', '.join(known)}"
            raise ConfigError(f"invalid config value task.generators={name!r}: not a reasoning-gym dataset; {hint}")


@config_check
def check_reasoning_gym_generators(cfg: Any) -> None:
    """At config time, before anything is written: every ``task.generators`` name is a dataset
    of the installed reasoning-gym (registered with the task's code; the CLI loads it before validating)."""
    if cfg.task.name == "reasoning_gym":
        check_generators(cfg.task.params.generators)


@TASKS.register("reasoning_gym")
class ReasoningGymTask:
    """The Task interface (sample_train, val_set, score, max_*_len) over reasoning-gym generators."""

    def __init__(self, cfg: TaskConfig, params: ReasoningGymConfig | None = None) -> None:
        self.cfg = cfg
        self.rg_cfg = params if params is not None else cfg.params  # ReasoningGymConfig: task.generators, ...
        self.name = "reasoning_gym:" + "+".join(self.rg_cfg.generators)
        check_generators(self.rg_cfg.generators)
        self.chat = self.rg_cfg.prompt_style == PromptStyle.chat
        self.max_prompt_len = 1 + self.rg_cfg.max_prompt_chars  # + BOS
        if self.chat:
            self.max_prompt_len += len(CHAT_INSTRUCTION) + 1 + CHAT_TEMPLATE_ALLOWANCE
        self.max_completion_len = self.rg_cfg.max_completion_tokens or self.rg_cfg.max_answer_chars + 1  # + EOS
        self._train: dict[str, Any] | None = None
        self._val: list[Problem] | None = None
        self._val_prompts: set[str] = set()
        self._scorers: dict[str, Any] = {}  # generator -> a dataset kept for its score_answer

    # -- datasets (built lazily: the config check only needs the lengths above)
    def _dataset(self, name: str, seed: int, size: int):
        rg = _import_rg()
        given = dict(self.rg_cfg.generator_args.get(name, {}) or {})
        kwargs = {**GENERATOR_DEFAULTS.get(name, {}), **given}
        try:
            return rg.create_dataset(name, seed=seed, size=size, **kwargs)
        except Exception as e:
            # blame what the user set: the arguments they gave this generator, else its name
            key = f"task.generator_args.{name}" if given else "task.generators"
            value = given if given else name
            why = f"reasoning-gym says {type(e).__name__}: {e}"
            raise ConfigError(f"invalid config value {key}={value!r}: {why}") from e

    def _prompt(self, name: str, entry: dict[str, Any]) -> str:
        if self.rg_cfg.prompt_style == PromptStyle.compact and name in COMPACT:
            text = COMPACT[name](entry)
        else:
            text = entry["question"]
        text = " ".join(str(text).split())
        return f"{text} {CHAT_INSTRUCTION}" if self.chat else text

    def _problem(self, name: str, entry: dict[str, Any]) -> RGProblem | None:
        """The entry as a problem, or None if it breaks the length / character limits."""
        prompt, answer = self._prompt(name, entry), str(entry["answer"])
        question = prompt[: -len(CHAT_INSTRUCTION) - 1] if self.chat else prompt
        if len(question) > self.rg_cfg.max_prompt_chars or len(answer) > self.rg_cfg.max_answer_chars:
            return None
        if not (_PRINTABLE.match(prompt) and _PRINTABLE.match(answer)):
            return None
        return RGProblem(prompt=prompt, target=answer, difficulty=name, generator=name, entry=entry)

    # -- problems
    def val_set(self) -> list[Problem]:
        """``cfg.val_size`` unique held-out problems from the ``val_seed`` datasets (round-robin)."""
        if self._val is None:
            gens = self.rg_cfg.generators
            size = 50 * self.cfg.val_size
            data = {g: self._dataset(g, self.rg_cfg.val_seed, size) for g in gens}
            seen: dict[str, Problem] = {}
            for i in range(size):
                for g in gens:
                    p = self._problem(g, data[g][i])
                    if p is not None:
                        seen.setdefault(p.prompt, p)
                if len(seen) >= self.cfg.val_size:
                    break
            if not seen:
                raise ConfigError(
                    f"task {self.name}: no problem fits max_prompt_chars={self.rg_cfg.max_prompt_chars} "
                    f"and max_answer_chars={self.rg_cfg.max_answer_chars}; raise them"
                )
            self._val = list(seen.values())[: self.cfg.val_size]
            self._val_prompts = {p.prompt for p in self._val}
        return self._val

    def is_val(self, problem: Problem) -> bool:
        self.val_set()
        return problem.prompt in self._val_prompts

    def sample_train(self, rng: random.Random, n: int) -> list[Problem]:
        """n training problems: a generator uniformly, then a random index of its train dataset."""
        self.val_set()
        if self._train is None:
            self._train = {
                g: self._dataset(g, self.rg_cfg.train_seed, self.rg_cfg.dataset_size) for g in self.rg_cfg.generators
            }
        out: list[Problem] = []
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > 1000 * n:
                raise ConfigError(
                    f"task {self.name}: training draws keep breaking the limits or hitting validation "
                    "prompts; raise task.max_prompt_chars / max_answer_chars"
                )
            g = self.rg_cfg.generators[rng.randrange(len(self.rg_cfg.generators))]
            p = self._problem(g, self._train[g][rng.randrange(self.rg_cfg.dataset_size)])
            if p is not None and p.prompt not in self._val_prompts:
                out.append(p)
        return out

    # -- verification: the package's own scorer
    def score(self, completion: str, problem: Problem) -> tuple[float, bool]:
        if not isinstance(problem, RGProblem):
            raise TypeError(f"{self.name} scores RGProblem instances, got {type(problem).__name__}")
        if self.chat:
            answer = strict_answer(completion, problem.target)
            if answer is None:  # no <answer> tags and no "Answer:" line: no answer was given
                return 0.0, False
            completion = answer
        reward = float(self._scorer(problem.generator).score_answer(completion, problem.entry))
        return reward, reward >= 1.0

    def _scorer(self, name: str):
        """A dataset of generator ``name``, for its ``score_answer``: built once per generator. (Built per
        completion, validation before the first training step took 0.2 s per completion on
        spell_backward, which reads its word list in its constructor.)"""
        if self._train is not None and name in self._train:
            return self._train[name]
        if name not in self._scorers:
            self._scorers[name] = self._dataset(name, self.rg_cfg.val_seed, 1)
        return self._scorers[name]

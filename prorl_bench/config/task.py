"""``task``: the verifiable task. Keys every task reads are ``TaskConfig``'s; a task's own parameters are
its registered dataclass (``ReasoningGymConfig``, ``CodeTaskConfig``, ``MathJsonlConfig``), flat keys of the
section (``task.generators``, ``task.timeout_s``, ``task.path``) recorded only when that task is selected.
The nested names of earlier versions (``task.code.timeout_s``, ``task.reasoning_gym.generators``) are
aliases (``config/aliases.py`` ``MOVED``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from prorl_bench import registry
from prorl_bench.config.chat_template import resolve_chat_template
from prorl_bench.config.enums import PromptStyle, RewardKind
from prorl_bench.config.options import bind_params

_require = registry.require  # ConfigError "invalid config value key=value: allowed ..." unless ok


@dataclass
class ReasoningGymConfig:
    """``task=reasoning_gym``: generators from the ``reasoning-gym`` package, scored by its own
    ``score_answer``. Training problems come from a dataset seeded ``train_seed``, validation ones from
    ``val_seed``; any validation question is removed from the training stream (held out by seed and
    by content). Problems whose prompt or answer is longer than the limits (characters) are skipped.
    """

    # reasoning-gym dataset names, e.g. spell_backward, basic_arithmetic, gsm_symbolic
    generators: list[str] = field(default_factory=lambda: ["spell_backward"])
    generator_args: dict[str, Any] = field(default_factory=dict)  # {generator: {kwarg: value}}
    prompt_style: PromptStyle = PromptStyle.compact  # compact | question | chat (see PromptStyle)
    max_prompt_chars: int = 30  # problems with longer prompts are skipped (characters)
    max_answer_chars: int = 12  # problems with longer answers are skipped (characters)
    train_seed: int = 1  # seed of the training dataset
    val_seed: int = 2  # seed of the held-out dataset (must differ from train_seed)
    dataset_size: int = 100_000  # virtual size of the training dataset (indices drawn from it)
    # Completion budget in tokens (TRL: max_completion_length); null = max_answer_chars + 1 (the
    # answer and EOS, enough when the policy answers directly). A model that reasons first (chat) needs more.
    max_completion_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_completion_tokens is not None:
            _require(
                self.max_completion_tokens >= 2,
                "task.max_completion_tokens",
                self.max_completion_tokens,
                ">= 2 (or null: max_answer_chars + 1)",
            )
        _require(len(self.generators) >= 1, "task.generators", self.generators, "a non-empty list")
        unknown = set(self.generator_args) - set(self.generators)
        _require(not unknown, "task.generator_args", sorted(unknown), f"keys among {self.generators}")
        _require(self.max_prompt_chars >= 4, "task.max_prompt_chars", self.max_prompt_chars, ">= 4")
        _require(self.max_answer_chars >= 1, "task.max_answer_chars", self.max_answer_chars, ">= 1")
        _require(self.train_seed != self.val_seed, "task.val_seed", self.val_seed, "!= train_seed")
        _require(self.dataset_size >= 1, "task.dataset_size", self.dataset_size, ">= 1")


@dataclass
class CodeTaskConfig:
    """``task=code``: Python functions checked by unit tests in the sandbox (prorl_bench/tasks/code_task.py)."""

    path: str | None = None  # training problems (JSONL, schema in code_task.py); null = the shipped set
    val_path: str | None = None  # held-out problems (ids disjoint from path's); null = the shipped set
    prompt_style: PromptStyle = PromptStyle.chat  # chat: through the tokenizer's chat template; question: plain
    max_completion_tokens: int = 256  # completion budget in tokens (TRL: max_completion_length)
    timeout_s: float = 5.0  # wall-clock limit per test call and for the top level (CPU: the same, rounded up), s
    memory_mb: int = 512  # memory limit per sample (its cgroup: all its processes and shared memory), MiB
    workers: int = 8  # programs run concurrently (sandbox processes)
    # the largest share of one scored batch that may be scorer_error (the scorer or the sandbox failed, not the
    # program); above it the run stops with an error (resumable from its last checkpoint); 1.0: never stops
    max_scorer_error_rate: float = 0.05
    # below isolation 'full' (root + util-linux unshare) or without a layer (cgroup, seccomp) the task refuses
    # to run unless this is true
    allow_weak_isolation: bool = False

    def __post_init__(self) -> None:
        _require(self.prompt_style != PromptStyle.compact, "task.prompt_style", "compact", "chat or question")
        _require(self.max_completion_tokens >= 8, "task.max_completion_tokens", self.max_completion_tokens, ">= 8")
        _require(0 < self.timeout_s <= 600, "task.timeout_s", self.timeout_s, "in (0, 600]")
        _require(self.memory_mb >= 32, "task.memory_mb", self.memory_mb, ">= 32")
        _require(self.workers >= 1, "task.workers", self.workers, ">= 1")
        _require(0 <= self.max_scorer_error_rate <= 1, "task.max_scorer_error_rate", self.max_scorer_error_rate,
                 "in [0, 1]")  # fmt: skip
        for key in ("path", "val_path"):
            value = getattr(self, key)
            _require(value is None or Path(value).expanduser().is_file(), f"task.{key}", value,
                     "null (the shipped problems) or an existing JSONL file")  # fmt: skip


@dataclass
class MathJsonlConfig:
    """``task=math_jsonl``: your problems, a JSONL file of {"question": ..., "answer": ...} (docs/own_data.md)."""

    path: str | None = MISSING  # required: training problems (JSONL); no default (task/math_jsonl.yaml: null, refused)
    val_path: str | None = None  # held-out problems (JSONL); null = task.val_fraction of path, by a hash of the text


@dataclass
class TaskConfig:
    """A verifiable sequence task. Lengths count input symbols (digits or bits).

    ``min_len``/``max_len`` apply to the built-in symbol tasks; a task's own parameters (``params``) are flat
    keys of this section, declared by the dataclass it registers (config/builtin_options.py).
    """

    # schema default (Python API); a composed run takes its regime's task (conf/regime/v2.yaml: sort_digits)
    name: str = "reverse_digits"  # a registered task (registry.TASKS; config/builtin_options.py declares the built-ins)
    min_len: int = 3  # shortest input (symbols; per operand for add) of a built-in task
    max_len: int = 5  # longest input (symbols); sets the completion budget of built-in tasks
    # exact: 1 iff the completion equals the target; partial: fraction of positions right
    reward: RewardKind = RewardKind.exact
    val_size: int = 128  # held-out problems used for validation
    val_fraction: float = 0.1  # share of the problem space reserved for validation
    # chat prompts of HF tasks (gsm, math_jsonl, code, reasoning_gym chat): a Jinja chat template, or a
    # file holding one, instead of the tokenizer's own; null = the tokenizer's
    chat_template: str | None = None
    params: Any = None  # the task's parameters (its dataclass instance; flat keys task.<key>)

    def __post_init__(self) -> None:
        self.params = bind_params(registry.TASKS, self.name, self.params)
        check = registry.TASKS.meta(self.name).get("check_config")
        if check is not None:  # the task checks the keys it owns (task.path for math_jsonl)
            check(self)
        if self.chat_template is not None:
            resolve_chat_template(self.chat_template)  # a file that exists, or template text
        _require(self.min_len >= 1, "task.min_len", self.min_len, "an integer >= 1")
        _require(
            self.max_len >= self.min_len,
            "task.max_len",
            self.max_len,
            f">= task.min_len ({self.min_len})",
        )
        _require(self.max_len <= 24, "task.max_len", self.max_len, "<= 24")
        _require(self.val_size >= 1, "task.val_size", self.val_size, ">= 1")
        _require(0.0 < self.val_fraction < 1.0, "task.val_fraction", self.val_fraction, "in (0, 1)")

"""Structured configs: the schema every YAML in ``conf/`` is merged into.

Hydra merges ``conf/<group>/<option>.yaml`` into these dataclasses, so

* an unknown option (``variant=Z``) fails in Hydra with the list of available options,
* a misspelled key (``algo.lrr=1``) fails with "Key 'lrr' not in 'AlgoConfig'",
* a value outside a closed set fails with the allowed values: an enum's, or for the pluggable axes
  (``algo.advantage``, ``kl_estimator.name``, ``task.name``, ``reset.trigger``, ``opt_reset.kind``,
  ``variant.reference``)
  the names registered in ``prorl_bench.registry`` — a new option registers itself next to its code,
* a value out of range fails in ``validate`` below (``__post_init__`` runs when
  ``OmegaConf.to_object`` builds the dataclasses), naming the key and the allowed range.

All of this happens before any model is built or any step is trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from prorl_bench import registry
from prorl_bench.models.chat_template import resolve_chat_template
from prorl_bench.registry import ConfigError
from prorl_bench.searchpath import register_resolvers
from prorl_bench.sweeps.study import StudyConfig

__all__ = ["ConfigError", "Config", "to_config", "register_configs"]


_require = registry.require  # ConfigError "invalid config value key=value: allowed ..." unless ok


# --------------------------------------------------------------------------- enums


class RewardKind(str, Enum):
    exact = "exact"  # 1 if the completion equals the target, else 0
    partial = "partial"  # fraction of target positions matched (length-normalised)


class KLPlacement(str, Enum):
    loss = "loss"
    reward = "reward"


class K2Mode(str, Enum):
    theta_over_ref = "theta_over_ref"
    ref_over_old = "ref_over_old"


class LossAgg(str, Enum):
    token = "token"  # mean over all response tokens of the minibatch
    sequence = "sequence"  # mean over tokens within a sequence, then over sequences
    seq_mean_token_sum = "seq_mean_token_sum"  # verl: sum over a sequence's tokens, mean over sequences
    # Dr. GRPO: sum over all tokens / (B * completion budget: algo.max_new_tokens or the task's), as TRL
    seq_mean_token_sum_norm = "seq_mean_token_sum_norm"


class StallMetric(str, Enum):
    success_greedy = "val/success_greedy"
    success_sampled = "val/success_sampled"
    reward_mean = "val/reward_mean"


class StepPolicy(str, Enum):
    keep = "keep"
    reset = "reset"


class KLControlKind(str, Enum):
    fixed = "fixed"
    adaptive = "adaptive"


class AdapterKind(str, Enum):
    none = "none"
    lora = "lora"
    dual_lora = "dual_lora"  # retain + forget adapters for gradient routing (prorl_bench/models/dual_lora.py)


class AdapterReferenceKind(str, Enum):
    auto = "auto"  # adapters when the base is frozen, else copy
    copy = "copy"  # a frozen deep copy of the whole policy
    adapters = "adapters"  # the policy's frozen base + the reference's own adapter weights (no copy)


class GrowthKind(str, Enum):
    none = "none"
    rank = "rank"


class Migration(str, Enum):
    preserve = "preserve"  # old slice keeps m, v by index; new slice zero; step kept
    reset = "reset"  # fresh state for the grown adapters
    naive = "naive"  # rebuild the optimizer on the new parameters: all state silently lost (baseline)


class NonFinitePolicy(str, Enum):
    fail = "fail"  # stop the run: status failed, step/stage/tensor named
    skip_batch = "skip_batch"  # skip the minibatch (or the step's update) with a counted warning


class ModelKind(str, Enum):
    native = "native"  # prorl_bench.models.model.TransformerPolicy over the character tokenizer
    hf_causal_lm = "hf_causal_lm"  # any local Hugging Face causal-LM directory (model.path)


class HFImpl(str, Enum):
    auto = "auto"  # measured: "fast" on CUDA, "hf" on CPU; LoRA targets' names can force either (hf_model._auto_impl)
    hf = "hf"  # the transformers module's own forward (any architecture)
    fast = "fast"  # prorl_bench.models.fast_llama: same weights, fused forward without HF's per-call overhead


class PromptStyle(str, Enum):
    compact = "compact"  # short prompt built from the generator's metadata (fits a char-level policy)
    question = "question"  # the generator's full natural-language question
    # the full question plus an answer-format instruction, rendered through the HF tokenizer's chat
    # template; the answer is extracted from <answer></answer> tags / "Answer:" / the last number
    chat = "chat"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"
    auto = "auto"


class DType(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


class DecodeImpl(str, Enum):  # hardware.decode (prorl_bench/models/decode.py; docs/performance.md "GPU path")
    auto = "auto"  # graph on CUDA, static on CPU (measured as fast or faster); dynamic for HF-module policies
    dynamic = "dynamic"  # rollout.generate's loop: attention over the filled prefix, a stop check per token on CPU
    static = "static"  # preallocated buffers, no host sync per token; bit-identical to dynamic
    graph = "graph"  # static shapes (whole-buffer attention), the step captured as a CUDA graph on CUDA


class UpdateNormMode(str, Enum):  # hardware.update_norm (prorl_bench/rl/optim.py)
    auto = "auto"  # device on CPU, host on CUDA (the GPU memory of a weight copy is the scarce one)
    device = "device"  # copy the trainable weights on their device before the update (exact)
    host = "host"  # copy them to host memory, compare tensor by tensor after the update (exact, same value)
    off = "off"  # no copy; update_norm is logged as NaN


class AdamWImpl(str, Enum):  # algo.adamw_impl (prorl_bench/rl/optim.py)
    auto = "auto"  # fused on CUDA; foreach on CPU (keeps CPU trajectories bit-identical to earlier releases)
    foreach = "foreach"  # torch's multi-tensor AdamW
    fused = "fused"  # torch's fused AdamW kernel (CUDA; CPU too since torch 2.4)


# --------------------------------------------------------------------------- groups


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
    max_prompt_chars: int = 40  # problems with longer prompts are skipped (characters)
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
                "task.reasoning_gym.max_completion_tokens",
                self.max_completion_tokens,
                ">= 2 (or null: max_answer_chars + 1)",
            )
        _require(len(self.generators) >= 1, "task.reasoning_gym.generators", self.generators, "a non-empty list")
        unknown = set(self.generator_args) - set(self.generators)
        _require(not unknown, "task.reasoning_gym.generator_args", sorted(unknown), f"keys among {self.generators}")
        _require(self.max_prompt_chars >= 4, "task.reasoning_gym.max_prompt_chars", self.max_prompt_chars, ">= 4")
        _require(self.max_answer_chars >= 1, "task.reasoning_gym.max_answer_chars", self.max_answer_chars, ">= 1")
        _require(self.train_seed != self.val_seed, "task.reasoning_gym.val_seed", self.val_seed, "!= train_seed")
        _require(self.dataset_size >= 1, "task.reasoning_gym.dataset_size", self.dataset_size, ">= 1")


@dataclass
class CodeTaskConfig:
    """``task=code``: Python functions checked by unit tests in the sandbox (prorl_bench/tasks/code_task.py)."""

    path: str | None = None  # training problems (JSONL, schema in code_task.py); null = the shipped set
    val_path: str | None = None  # held-out problems (ids disjoint from path's); null = the shipped set
    prompt_style: PromptStyle = PromptStyle.chat  # chat: through the tokenizer's chat template; question: plain
    max_completion_tokens: int = 256  # completion budget in tokens (TRL: max_completion_length)
    timeout_s: float = 5.0  # wall-clock limit per program (its CPU limit is the same, rounded up), seconds
    memory_mb: int = 512  # address-space limit per program, MiB
    workers: int = 8  # programs run concurrently (sandbox processes)
    # below isolation 'full' (root + util-linux unshare) the task refuses to run unless this is true
    allow_weak_isolation: bool = False

    def __post_init__(self) -> None:
        _require(self.prompt_style != PromptStyle.compact, "task.code.prompt_style", "compact", "chat or question")
        _require(self.max_completion_tokens >= 8, "task.code.max_completion_tokens", self.max_completion_tokens, ">= 8")
        _require(0 < self.timeout_s <= 600, "task.code.timeout_s", self.timeout_s, "in (0, 600]")
        _require(self.memory_mb >= 32, "task.code.memory_mb", self.memory_mb, ">= 32")
        _require(self.workers >= 1, "task.code.workers", self.workers, ">= 1")
        for key in ("path", "val_path"):
            value = getattr(self, key)
            _require(value is None or Path(value).expanduser().is_file(), f"task.code.{key}", value,
                     "null (the shipped problems) or an existing JSONL file")  # fmt: skip


@dataclass
class TaskConfig:
    """A verifiable sequence task. Lengths count input symbols (digits or bits).

    ``min_len``/``max_len`` apply to the built-in tasks; ``reasoning_gym`` configures ``name=reasoning_gym``.
    """

    name: str = "reverse_digits"  # a registered task (registry.TASKS; tasks.py lists the built-ins)
    params: dict[str, Any] = field(default_factory=dict)  # the task's own parameters (checked by it)
    min_len: int = 3  # shortest input (symbols; per operand for add) of a built-in task
    max_len: int = 5  # longest input (symbols); sets the completion budget of built-in tasks
    # exact: 1 iff the completion equals the target; partial: fraction of positions right
    reward: RewardKind = RewardKind.exact
    val_size: int = 128  # held-out problems used for validation
    val_fraction: float = 0.1  # share of the problem space reserved for validation
    reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)
    code: CodeTaskConfig = field(default_factory=CodeTaskConfig)  # task=code only
    # task=math_jsonl: your problems, a JSONL file of {"question": ..., "answer": ...} (docs/own_data.md)
    path: str | None = None
    val_path: str | None = None  # task=math_jsonl: held-out problems (JSONL); null = val_fraction of path, by hash
    # chat prompts of HF tasks (gsm, math_jsonl, code, reasoning_gym chat): a Jinja chat template, or a
    # file holding one, instead of the tokenizer's own; null = the tokenizer's
    chat_template: str | None = None

    def __post_init__(self) -> None:
        registry.TASKS.params(registry.TASKS.check(self.name), self.params, "task.params")
        check = registry.TASKS.meta(self.name).get("check_config")
        if check is not None:  # the task checks the keys it owns (task.path for math_jsonl)
            check(self)
        for key in ("path", "val_path"):
            _require(getattr(self, key) is None or registry.TASKS.meta(self.name).get("reads_path", False),
                     f"task.{key}", getattr(self, key), f"null with task={self.name} (read by task=math_jsonl; "
                     "task=code has task.code.path)")  # fmt: skip
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


@dataclass
class VariantConfig:
    """A variant is a named preset over two axes: the reference strategy and whether the reference
    may be reset. A0-C are fixed presets (conf/variant); another combination needs another name."""

    name: str = "A1"  # the output label: A0 | A1 | A2 | B | C (README "Variants"), or your own name
    # where reference logprobs come from (registry.REFERENCES; reference.py): recompute | cached | buffered | none
    reference: str = "cached"
    resets: bool = False  # the reference may be reset (reset.trigger); the C preset
    params: dict[str, Any] = field(default_factory=dict)  # the reference strategy's own parameters (checked by it)

    @classmethod
    def preset(cls, name: str) -> VariantConfig:
        """The named preset (A0, A1, A2, B or C) as conf/variant/NAME.yaml states it."""
        reference, resets = VARIANT_PRESETS[name]
        return cls(name=name, reference=reference, resets=resets)

    def __post_init__(self) -> None:
        registry.REFERENCES.params(registry.REFERENCES.check(self.reference), self.params, "variant.params")
        _require(self.name.isidentifier(), "variant.name", self.name, "an identifier (it labels outputs)")
        preset = VARIANT_PRESETS.get(self.name)
        if preset is not None:
            _require(
                (self.reference, self.resets) == preset,
                "variant.reference" if self.reference != preset[0] else "variant.resets",
                self.reference if self.reference != preset[0] else self.resets,
                f"reference={preset[0]}, resets={str(preset[1]).lower()} for variant {self.name} (the A0-C labels "
                "name fixed presets; give another variant.name for another combination)",
            )


# variant name -> (reference strategy, resets allowed)
VARIANT_PRESETS = {
    "A0": ("recompute", False),  # frozen reference, logprobs recomputed every epoch/minibatch
    "A1": ("cached", False),  # frozen reference, logprobs computed once per rollout and cached
    "A2": ("buffered", False),  # as A1, into a preallocated buffer reused across steps
    "B": ("none", False),  # no reference model; trust region vs pi_old
    "C": ("cached", True),  # A1 + reference resets and an optimizer-state policy
}


@dataclass
class KLConfig:
    """Per-token KL estimator; see prorl_bench/rl/kl.py for the formulas."""

    name: str = "k3"  # a registered estimator (registry.KL_ESTIMATORS; kl.py has the built-ins)
    params: dict[str, Any] = field(default_factory=dict)  # the estimator's own parameters (checked by it)
    # loss: beta*KL in the loss (GRPO); reward: -beta*KL folded into the reward (PPO-RLHF)
    placement: KLPlacement = KLPlacement.loss
    log_ratio_clamp: float = 20.0  # |logp_theta - logp_ref| clamped before exp (verl/NeMo RL)
    kl_clamp: float = 10.0  # estimators registered clamped=True (k3): per-token value clamped to +-kl_clamp (kl.py)
    # theta_over_ref; or ref_over_old (ProRL v2 blog formula, reward placement only)
    k2_mode: K2Mode = K2Mode.theta_over_ref

    def __post_init__(self) -> None:
        _require(self.log_ratio_clamp > 0, "kl_estimator.log_ratio_clamp", self.log_ratio_clamp, "> 0")
        _require(self.kl_clamp > 0, "kl_estimator.kl_clamp", self.kl_clamp, "> 0")
        registry.KL_ESTIMATORS.params(registry.KL_ESTIMATORS.check(self.name), self.params, "kl_estimator.params")
        _require(
            not (registry.KL_ESTIMATORS.meta(self.name).get("reward_only") and self.placement == KLPlacement.loss),
            "kl_estimator.placement",
            self.placement.value,
            f"'reward' with {self.name} (as a loss its expected gradient is zero; use an estimator such as k2/k3 "
            "in the loss)",
        )


POSITIONS = ("learned", "answer", "rope")  # model.positions (prorl_bench/models/model.py says why each)


@dataclass
class ModelConfig:
    """``kind=native`` uses d_model..max_seq_len. ``kind=hf_causal_lm`` loads ``path`` (a local
    directory with config.json, weights and tokenizer; nothing is downloaded) and ignores the native
    size fields; ``impl`` picks the forward implementation (see HFImpl)."""

    kind: ModelKind = ModelKind.native  # native (char-level TransformerPolicy) | hf_causal_lm (a local HF directory)
    d_model: int = 64  # native: residual width
    n_layers: int = 2  # native: transformer blocks
    n_heads: int = 4  # native: attention heads (divides d_model)
    dropout: float = 0.0  # native: dropout probability (0 keeps RL deterministic)
    max_seq_len: int = 64  # native: context length in tokens (prompt + completion + BOS)
    positions: str = "learned"  # native: learned (from the row start) | answer (from the answer start) | rope
    path: str | None = None  # hf_causal_lm: local model directory (config.json, weights, tokenizer)
    impl: HFImpl = HFImpl.auto  # hf_causal_lm forward: auto | hf | fast (see HFImpl)

    def __post_init__(self) -> None:
        if self.kind == ModelKind.hf_causal_lm:
            _check_hf_path(self.path)
        _require(self.d_model >= 8, "model.d_model", self.d_model, ">= 8")
        _require(self.n_layers >= 1, "model.n_layers", self.n_layers, ">= 1")
        _require(self.n_heads >= 1, "model.n_heads", self.n_heads, ">= 1")
        _require(
            self.d_model % self.n_heads == 0,
            "model.n_heads",
            self.n_heads,
            f"a divisor of model.d_model ({self.d_model})",
        )
        _require(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "in [0, 1)")
        _require(self.max_seq_len >= 8, "model.max_seq_len", self.max_seq_len, ">= 8")
        _require(self.positions in POSITIONS, "model.positions", self.positions, ", ".join(POSITIONS))
        _require(
            self.positions == "learned" or (self.d_model // self.n_heads) % 2 == 0,
            "model.positions",
            self.positions,
            "learned when the head dimension (d_model / n_heads) is odd",
        )


def _check_hf_path(path: str | None) -> None:
    allowed = "a local Hugging Face model directory containing config.json (nothing is downloaded)"
    _require(path is not None and str(path) != "", "model.path", path, allowed)
    from pathlib import Path

    p = Path(str(path)).expanduser()
    _require(p.is_dir(), "model.path", path, allowed + f"; {p} does not exist or is not a directory")
    _require((p / "config.json").is_file(), "model.path", path, allowed + f"; {p} has no config.json")


@dataclass
class AlgoConfig:
    """RL algorithm knobs. lr in AdamW units; beta multiplies the KL term."""

    advantage: str = "grpo"  # a registered estimator (registry.ADVANTAGES; advantages.py has the built-ins)
    advantage_params: dict[str, Any] = field(default_factory=dict)  # the estimator's own parameters (checked by it)
    prompts_per_step: int = 8  # prompts per RL step (verl train_batch_size); the batch is prompts_per_step*group_size
    group_size: int = 8  # samples per prompt (TRL num_generations, verl rollout.n)
    temperature: float = 1.0  # sampling temperature; logprobs are of logits/temperature
    top_k: int = 0  # 0 = no top-k filtering
    # nucleus sampling of the training rollouts (Holtzman et al. 2020; TRL/vLLM top_p); 1 = off. The
    # loss's logprobs are of the full tempered distribution, as in TRL and verl (an off-policy bias < 1)
    top_p: float = 1.0
    # completion budget in tokens for every task (TRL max_completion_length); null = the task's own
    max_new_tokens: int | None = None
    eps_low: float = 0.2  # PPO clip: ratio >= 1-eps_low (TRL epsilon, verl clip_ratio_low)
    eps_high: float = 0.28  # PPO clip: ratio <= 1+eps_high; > eps_low is DAPO clip-higher (Yu et al. 2025)
    ppo_epochs: int = 2  # passes over each rollout (TRL num_iterations, verl ppo_epochs)
    minibatches: int = 2  # optimizer steps per epoch: a count, not a size (batch / minibatches rows each)
    loss_agg: LossAgg = LossAgg.token  # token | sequence | seq_mean_token_sum | seq_mean_token_sum_norm (see LossAgg)
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal from the update
    entropy_coef: float = 0.0  # entropy bonus weight (0 = none, as ProRL)
    beta: float = 0.01  # KL coefficient (TRL beta, verl kl_loss_coef); the initial value under kl_ctl=adaptive
    lr: float = 1e-3  # AdamW learning rate (constant after lr_warmup_steps)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    adam_beta1: float = 0.9  # AdamW beta1 (first-moment decay)
    adam_beta2: float = 0.999  # AdamW beta2 (second-moment decay)
    adam_eps: float = 1e-8  # AdamW epsilon
    adamw_impl: AdamWImpl = AdamWImpl.auto  # auto | foreach | fused (see AdamWImpl)
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    lr_warmup_steps: int = 0  # linear LR warm-up at the start (and after a hard reset)
    adv_eps: float = 1e-6  # added to std in group/batch normalisation
    # verl's dual-clip PPO (Ye et al. 2020, "Mastering complex control in MOBA games"): for A < 0
    # the per-token loss is capped at clip_ratio_c * |A|, so one token with a huge ratio cannot
    # dominate the update. null disables it; verl's default when enabled is 3.0.
    clip_ratio_c: float | None = None

    def __post_init__(self) -> None:
        registry.ADVANTAGES.params(
            registry.ADVANTAGES.check(self.advantage), self.advantage_params, "algo.advantage_params"
        )
        if self.clip_ratio_c is not None:
            _require(self.clip_ratio_c > 1, "algo.clip_ratio_c", self.clip_ratio_c, "> 1 (or null to disable)")
        _require(self.prompts_per_step >= 1, "algo.prompts_per_step", self.prompts_per_step, ">= 1")
        _require(
            self.group_size >= 2,
            "algo.group_size",
            self.group_size,
            f">= 2 (every advantage estimator, here '{self.advantage}', uses a group baseline)",
        )
        # outside this range the sampling distribution is numerically one-hot or uniform and the
        # logprobs (logits / T) overflow or underflow: temperature=1e-45 used to crash in sampling
        _require(1e-3 <= self.temperature <= 1e3, "algo.temperature", self.temperature, "in [0.001, 1000]")
        _require(self.top_k >= 0, "algo.top_k", self.top_k, ">= 0 (0 disables)")
        _require(0.0 < self.top_p <= 1.0, "algo.top_p", self.top_p, "in (0, 1] (1 disables)")
        _require(
            self.max_new_tokens is None or self.max_new_tokens >= 1, "algo.max_new_tokens", self.max_new_tokens,
            "null (the task's budget) or >= 1",
        )  # fmt: skip
        _require(self.eps_low >= 0, "algo.eps_low", self.eps_low, ">= 0")
        _require(self.eps_low < 1, "algo.eps_low", self.eps_low, "< 1")
        _require(self.eps_high >= 0, "algo.eps_high", self.eps_high, ">= 0")
        _require(self.ppo_epochs >= 1, "algo.ppo_epochs", self.ppo_epochs, ">= 1")
        _require(self.minibatches >= 1, "algo.minibatches", self.minibatches, ">= 1")
        batch = self.prompts_per_step * self.group_size
        _require(
            batch % self.minibatches == 0,
            "algo.minibatches",
            self.minibatches,
            f"a divisor of prompts_per_step*group_size ({batch})",
        )
        _require(self.entropy_coef >= 0, "algo.entropy_coef", self.entropy_coef, ">= 0")
        _require(self.beta >= 0, "algo.beta", self.beta, ">= 0")
        _require(self.lr > 0, "algo.lr", self.lr, "> 0")
        _require(self.weight_decay >= 0, "algo.weight_decay", self.weight_decay, ">= 0")
        _require(0 <= self.adam_beta1 < 1, "algo.adam_beta1", self.adam_beta1, "in [0, 1)")
        _require(0 <= self.adam_beta2 < 1, "algo.adam_beta2", self.adam_beta2, "in [0, 1)")
        _require(self.adam_eps > 0, "algo.adam_eps", self.adam_eps, "> 0")
        _require(self.grad_clip >= 0, "algo.grad_clip", self.grad_clip, ">= 0 (0 disables)")
        _require(self.adv_eps > 0, "algo.adv_eps", self.adv_eps, "> 0")
        _require(self.lr_warmup_steps >= 0, "algo.lr_warmup_steps", self.lr_warmup_steps, ">= 0")


@dataclass
class ResetConfig:
    """Reference-reset trigger (variant C). ``min_spacing``: no two resets closer than this (steps)."""

    trigger: str = "none"  # a registered trigger (registry.RESET_TRIGGERS; resets.py has the built-ins)
    every: int = 50  # periodic / polyak period (steps)
    kl_threshold: float | None = None  # kl_spike: absolute threshold on kl/ref
    kl_multiple: float | None = None  # kl_spike: threshold as a multiple of the running mean
    kl_ema: float = 0.9  # kl_spike: decay of the running mean of kl/ref
    kl_warmup: int = 5  # kl_spike: steps of running-mean history before the multiple applies
    metric: StallMetric = StallMetric.success_greedy  # stall: held-out metric watched
    patience: int = 2  # stall: evaluations without improvement before a reset
    min_delta: float = 0.0  # stall: an improvement must exceed the best by more than this
    # what a reset does, whatever triggers it: pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref.
    # null = the trigger's default (1, a copy; polyak 0.6 = TRL ref_model_mixup_alpha)
    alpha: float | None = None
    min_spacing: int = 0  # no two resets closer than this (steps); a condition inside it is dropped
    restore_beta: bool = False  # reset the adaptive KL coefficient to its initial value
    params: dict[str, Any] = field(default_factory=dict)  # the trigger's own parameters (checked by it)

    def __post_init__(self) -> None:
        _require(self.every >= 1, "reset.every", self.every, ">= 1")
        _require(self.min_spacing >= 0, "reset.min_spacing", self.min_spacing, ">= 0")
        _require(self.alpha is None or 0 < self.alpha <= 1, "reset.alpha", self.alpha, "null or in (0, 1]")
        _require(0 <= self.kl_ema < 1, "reset.kl_ema", self.kl_ema, "in [0, 1)")
        _require(self.kl_warmup >= 0, "reset.kl_warmup", self.kl_warmup, ">= 0")
        _require(self.patience >= 1, "reset.patience", self.patience, ">= 1")
        _require(self.min_delta >= 0, "reset.min_delta", self.min_delta, ">= 0")
        _require(
            self.kl_threshold is None or self.kl_threshold > 0, "reset.kl_threshold", self.kl_threshold, "null or > 0"
        )
        _require(self.kl_multiple is None or self.kl_multiple > 1, "reset.kl_multiple", self.kl_multiple, "null or > 1")
        registry.RESET_TRIGGERS.params(self.trigger, self.params, "reset.params")
        registry.RESET_TRIGGERS[self.trigger].validate(self)  # the trigger's own requirements


@dataclass
class OptResetConfig:
    """What a reset does to AdamW's state. Every kind states its ``step`` policy explicitly.

    ``rewarmup_steps`` > 0 ramps the LR linearly from lr/N back to lr over N steps after a reset.
    """

    kind: str = "keep"  # a registered transform (registry.OPT_TRANSFORMS; opt_state.py has the built-ins)
    factor: float = 0.1  # soft: m and v scaled by this
    m_factor: float = 0.0  # asym: first moment scaled by this
    v_factor: float = 1.0  # asym: second moment scaled by this
    step: StepPolicy = StepPolicy.keep  # keep | reset AdamW's step counter (bias correction) at a reset
    rewarmup_steps: int = 0  # after a reset ramp the LR from lr/N back to lr over N steps (0 = off)
    params: dict[str, Any] = field(default_factory=dict)  # the transform's own parameters (checked by it)

    def __post_init__(self) -> None:
        for key in ("factor", "m_factor", "v_factor"):
            val = getattr(self, key)
            _require(0.0 <= val <= 1.0, f"opt_reset.{key}", val, "in [0, 1]")
        _require(self.rewarmup_steps >= 0, "opt_reset.rewarmup_steps", self.rewarmup_steps, ">= 0")
        # a transform may fix the step policy (hard must equal a fresh optimizer; keep changes nothing)
        registry.OPT_TRANSFORMS.params(registry.OPT_TRANSFORMS.check(self.kind), self.params, "opt_reset.params")
        meta = registry.OPT_TRANSFORMS.meta(self.kind)
        if meta.get("step") is not None:
            _require(
                self.step.value == meta["step"],
                "opt_reset.step",
                self.step.value,
                f"'{meta['step']}' with kind={self.kind} ({meta['why']})",
            )


@dataclass
class KLControlConfig:
    """KL coefficient: fixed at algo.beta, or adaptive toward ``target`` (PPO / verl style)."""

    # fixed (beta = algo.beta) | adaptive (PPO/verl controller toward kl_ctl.target)
    kind: KLControlKind = KLControlKind.fixed
    target: float = 0.05  # target KL per token (nats, kl/ref)
    horizon: int = 100  # steps over which a 20% proportional error moves beta by ~20%
    beta_min: float = 1e-5  # adaptive: lower bound of beta
    beta_max: float = 1.0  # adaptive: upper bound of beta

    def __post_init__(self) -> None:
        _require(self.target > 0, "kl_ctl.target", self.target, "> 0")
        _require(self.horizon >= 1, "kl_ctl.horizon", self.horizon, ">= 1")
        _require(self.beta_min >= 0, "kl_ctl.beta_min", self.beta_min, ">= 0")
        _require(self.beta_max >= self.beta_min, "kl_ctl.beta_max", self.beta_max, f">= beta_min ({self.beta_min})")


@dataclass
class AdapterConfig:
    """LoRA adapters on the policy's linear layers named in ``targets`` (attribute names)."""

    kind: AdapterKind = AdapterKind.none  # none | lora | dual_lora
    rank: int = 4  # LoRA rank r (Hu et al. 2021)
    retain_rank: int = 4  # dual_lora: rank of the retain adapter (learns from unlabelled samples only)
    forget_rank: int = 4  # dual_lora: rank of the forget adapter (learns from every sample)
    alpha: float = 8.0  # scaling = alpha / initial rank, kept fixed when the rank grows
    # linear layers that get adapters (attribute names: qkv, proj, fc1, fc2 native; q_proj... HF)
    targets: list[str] = field(default_factory=lambda: ["qkv", "proj", "fc1", "fc2"])
    freeze_base: bool = True  # train only the adapters (the base is frozen)
    # How the reference model is held (variants with a reference): ``adapters`` shares the frozen
    # base with the policy and keeps only a copy of the adapter weights (TRL disables a PEFT
    # adapter for the same purpose); trajectories equal the deep copy's bit for bit (tested).
    reference: AdapterReferenceKind = AdapterReferenceKind.auto

    def __post_init__(self) -> None:
        _require(
            not (self.reference == AdapterReferenceKind.adapters and not self.freeze_base),
            "adapter.reference",
            self.reference.value,
            "copy or auto when adapter.freeze_base=false (the base trains, so the reference needs its own copy)",
        )
        _require(self.rank >= 1, "adapter.rank", self.rank, ">= 1")
        _require(self.retain_rank >= 1, "adapter.retain_rank", self.retain_rank, ">= 1")
        _require(self.forget_rank >= 1, "adapter.forget_rank", self.forget_rank, ">= 1")
        _require(
            not (self.kind == AdapterKind.dual_lora and self.reference == AdapterReferenceKind.adapters),
            "adapter.reference",
            self.reference.value,
            "copy or auto with adapter=dual_lora (its reference is a frozen copy of the policy)",
        )
        _require(self.alpha > 0, "adapter.alpha", self.alpha, "> 0")
        _require(len(self.targets) > 0, "adapter.targets", self.targets, "a non-empty list of layer names")


@dataclass
class DetectorConfig:
    """Gradient routing's detector (prorl_bench/tasks/detectors.py): labels each sampled completion as
    showing the unwanted behaviour or not. Labelled samples train only the forget adapter."""

    name: str = "none"  # a registered detector (registry.DETECTORS): none | pattern | reward_field
    params: dict[str, Any] = field(default_factory=dict)  # the detector's parameters (checked by it)
    # Partial oversight (prorl_bench/tasks/detectors.py Oversight; docs/routing.md): the labels the run sees
    recall: float = 1.0  # share of the detector's positives reported (misses: a seeded stream, same in every arm)
    false_positive_rate: float = 0.0  # share of the detector's negatives reported anyway (same stream)
    miss_pattern: str | None = None  # a systematic blind spot: completions matching this regex are never reported

    def __post_init__(self) -> None:
        import re

        registry.DETECTORS.check(self.name)
        registry.DETECTORS[self.name].validate(self.params)
        _require(0.0 <= self.recall <= 1.0, "detector.recall", self.recall, "in [0, 1]")
        _require(
            0.0 <= self.false_positive_rate <= 1.0,
            "detector.false_positive_rate",
            self.false_positive_rate,
            "in [0, 1]",
        )
        if self.miss_pattern is not None:
            try:
                re.compile(self.miss_pattern)
            except re.error as e:
                raise ConfigError(f"invalid config value detector.miss_pattern={self.miss_pattern!r}: {e}") from None
        partial = self.recall != 1.0 or self.false_positive_rate != 0.0 or self.miss_pattern is not None
        _require(
            not (partial and self.name == "none"),
            "detector",
            self.name,
            "a detector (not 'none') when detector.recall / false_positive_rate / miss_pattern are set",
        )


class RouteUse(str, Enum):
    """What the detector's labels do (docs/routing.md): the arms of a routing study."""

    route = "route"  # gradient routing: labelled samples train only the forget adapter (adapter=dual_lora)
    filter = "filter"  # data filtering: labelled samples are dropped from the update
    penalize = "penalize"  # reward shaping: route.penalty is subtracted from labelled samples' rewards
    observe = "observe"  # labels computed and logged, not used: a plain baseline that sees the same detector


class RouteAdvantages(str, Enum):
    group = "group"  # advantages over the whole group, then routed / filtered
    split = "split"  # the retain adapter's (filter: the update's) rows normalised within the unlabelled subset


@dataclass
class RouteConfig:
    """How a run uses its detector's labels (only with a detector; prorl_bench/run/routing.py)."""

    use: RouteUse = RouteUse.route  # route | filter | penalize | observe
    # group | split: split normalises unlabelled rows within the unlabelled subset of their group
    # (route: the retain adapter's advantages; the forget adapter keeps the whole group's)
    advantages: RouteAdvantages = RouteAdvantages.group
    penalty: float | None = None  # penalize: subtracted from a labelled sample's reward; null = the task's hack bonus

    def __post_init__(self) -> None:
        _require(self.penalty is None or self.penalty >= 0, "route.penalty", self.penalty, "null or >= 0")
        _require(
            not (self.advantages == RouteAdvantages.split and self.use in (RouteUse.penalize, RouteUse.observe)),
            "route.advantages",
            self.advantages.value,
            f"'group' with route.use={self.use.value} (nothing is routed or dropped, so there is no subset to split)",
        )
        _require(
            self.penalty is None or self.use == RouteUse.penalize,
            "route.penalty",
            self.penalty,
            "null unless route.use=penalize",
        )


@dataclass
class GrowthConfig:
    """Adapter rank growth by ``rank_step`` up to ``max_rank`` (every N steps / at resets / on stall)."""

    kind: GrowthKind = GrowthKind.none  # none | rank (adapter rank growth)
    rank_step: int = 2  # rank added per growth
    grow_every: int = 50  # 0 disables periodic growth
    max_rank: int = 16  # no growth beyond this rank
    at_reset: bool = False  # grow at every reference reset
    on_stall: bool = False  # grow when reset.metric stalls for growth.patience evaluations
    patience: int = 2  # on_stall: evaluations of reset.metric without improvement
    # preserve | reset | naive: what happens to AdamW state at growth (see Migration)
    migration: Migration = Migration.preserve

    def __post_init__(self) -> None:
        _require(self.rank_step >= 1, "growth.rank_step", self.rank_step, ">= 1")
        _require(self.grow_every >= 0, "growth.grow_every", self.grow_every, ">= 0 (0 disables)")
        _require(self.max_rank >= 1, "growth.max_rank", self.max_rank, ">= 1")
        _require(self.patience >= 1, "growth.patience", self.patience, ">= 1")


@dataclass
class CheckpointConfig:
    every: int = 50  # steps between checkpoints; 0 disables (a preemption signal still checkpoints)
    keep_last: int = 2  # checkpoints kept on disk (older ones deleted)

    def __post_init__(self) -> None:
        _require(self.every >= 0, "checkpoint.every", self.every, ">= 0 (0 disables)")
        _require(self.keep_last >= 1, "checkpoint.keep_last", self.keep_last, ">= 1")


@dataclass
class GuardConfig:
    nonfinite: NonFinitePolicy = NonFinitePolicy.fail  # fail | skip_batch on NaN/inf (see NonFinitePolicy)


@dataclass
class HardwareConfig:
    device: Device = Device.cpu  # cpu | cuda | auto
    # null: a single run uses the CPUs it may run on (affinity), capped by OMP_NUM_THREADS; 1 per multirun job
    torch_threads: int | None = None
    dtype: DType = DType.fp32  # fp32 | bf16 (bf16 autocast on CUDA only)
    deterministic: bool = True  # torch.use_deterministic_algorithms (warn_only)
    tf32: bool = False  # allow TF32 matmuls on CUDA
    peak_flops: float | None = None  # FLOP/s for MFU; None = measure a matmul peak once
    decode: DecodeImpl = DecodeImpl.auto  # sampling loop: auto | dynamic | static | graph (see DecodeImpl)
    update_norm: UpdateNormMode = UpdateNormMode.auto  # where the update_norm snapshot lives (see UpdateNormMode)
    logits_mb: float = 256.0  # log-prob passes run the LM head on position chunks of <= this many MiB of fp32 logits

    def __post_init__(self) -> None:
        _require(
            self.torch_threads is None or self.torch_threads >= 1,
            "hardware.torch_threads",
            self.torch_threads,
            "null or >= 1",
        )
        _require(
            self.peak_flops is None or self.peak_flops > 0,
            "hardware.peak_flops",
            self.peak_flops,
            "null or > 0",
        )
        _require(self.logits_mb > 0, "hardware.logits_mb", self.logits_mb, "> 0")
        _require(
            not (self.device == Device.cpu and self.dtype == DType.bf16),
            "hardware.dtype",
            self.dtype.value,
            "fp32 on device=cpu (bf16 autocast is a CUDA path)",
        )


@dataclass
class WarmupConfig:
    """Supervised warm-up that produces the base policy RL starts from (as ProRL starts from SFT).

    Warm-up stops as soon as the base's *sampled* success rate on held-out problems reaches
    ``target_success`` — leaving RL headroom above it. The base is cached on disk, keyed by
    everything that determines it (task, model, this section), and shared by every run of a sweep.
    """

    target_success: float = 0.2  # stop warm-up when sampled held-out success reaches this
    max_steps: int = 3000  # warm-up step limit (error if the target is not reached)
    batch_size: int = 64  # warm-up problems per supervised step
    lr: float = 3e-3  # warm-up AdamW learning rate
    check_every: int = 10  # warm-up steps between success checks
    check_size: int = 128  # held-out problems per success check
    seed: int = 0  # warm-up seed (part of the base cache key; per-seed bases: set it to the run seed)
    cache_dir: str = "outputs/base_cache"  # relative paths resolve against the launch directory
    # null: warm up native policies, not Hugging Face ones (a pretrained LM is already a base).
    # true on an HF model fine-tunes it on the task first (cached the same way); false skips it.
    enabled: bool | None = None

    def __post_init__(self) -> None:
        _require(0.0 < self.target_success <= 1.0, "warmup.target_success", self.target_success, "in (0, 1]")
        _require(self.max_steps >= 1, "warmup.max_steps", self.max_steps, ">= 1")
        _require(self.batch_size >= 1, "warmup.batch_size", self.batch_size, ">= 1")
        _require(self.lr > 0, "warmup.lr", self.lr, "> 0")
        _require(self.check_every >= 1, "warmup.check_every", self.check_every, ">= 1")
        _require(self.check_size >= 1, "warmup.check_size", self.check_size, ">= 1")


@dataclass
class ExportConfig:
    """``at_end``: export the final policy to ``<run_dir>/export`` (format: prorl_bench/cli/export.py)."""

    at_end: bool = False  # export the final policy to <run_dir>/export


@dataclass
class TrackingConfig:
    """Optional sinks beside the JSONL files (see prorl_bench/run/sinks.py); both need an extra."""

    tensorboard: bool = False  # scalars under RUN_DIR/tensorboard
    wandb: bool = False  # Weights & Biases, always offline (files under RUN_DIR/wandb)
    wandb_project: str = "prorl-bench"  # W&B project name (offline)


@dataclass
class EvalConfig:
    """Held-out evaluation (every ``eval_every`` steps, at the end, and of the base at step 0).

    ``n_samples`` samples per held-out prompt give unbiased pass@k for every k in ``ks`` (Chen et al.
    2021) and the per-prompt diversity; ``n_sample_prompts`` prompts are written with all their
    samples to ``samples.jsonl``; ``batch`` sequences are generated per call (memory vs speed).
    """

    n_samples: int = 16  # samples per held-out prompt (pass@k needs k <= n_samples)
    # k values of val/pass@k (Chen et al. 2021 unbiased estimator)
    ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    n_sample_prompts: int = 8  # prompts written with their samples to samples.jsonl (base and final step: all)
    batch: int = 512  # sequences generated per call during evaluation (memory vs speed)
    at_start: bool = True  # evaluate the base policy at step 0 (every run carries its own "before")

    def __post_init__(self) -> None:
        _require(self.n_samples >= 1, "eval.n_samples", self.n_samples, ">= 1")
        _require(len(self.ks) >= 1, "eval.ks", self.ks, "a non-empty list")
        bad = [k for k in self.ks if not 1 <= k <= self.n_samples]
        _require(not bad, "eval.ks", self.ks, f"values in [1, eval.n_samples={self.n_samples}]")
        _require(len(set(self.ks)) == len(self.ks), "eval.ks", self.ks, "distinct values")
        _require(self.n_sample_prompts >= 0, "eval.n_sample_prompts", self.n_sample_prompts, ">= 0")
        _require(self.batch >= 1, "eval.batch", self.batch, ">= 1")


@dataclass
class Config:
    task: TaskConfig = field(default_factory=TaskConfig)
    variant: VariantConfig = field(default_factory=VariantConfig)
    kl_estimator: KLConfig = field(default_factory=KLConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    reset: ResetConfig = field(default_factory=ResetConfig)
    opt_reset: OptResetConfig = field(default_factory=OptResetConfig)
    kl_ctl: KLControlConfig = field(default_factory=KLControlConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    growth: GrowthConfig = field(default_factory=GrowthConfig)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    route: RouteConfig = field(default_factory=RouteConfig)  # what the detector's labels do (routing.py)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0  # run seed: prompts, sampling, minibatch order, initial weights (< 2**24)
    steps: int = 150  # RL steps = rollouts (not optimizer steps)
    eval_every: int = 25  # validation on the held-out split every N steps (and at the end)
    progress: bool = True  # terminal progress bar (single runs only)
    run_dir: str | None = None  # None: Hydra's output directory
    export: ExportConfig = field(default_factory=ExportConfig)
    study: StudyConfig = field(default_factory=StudyConfig)  # a study grid's question and seed blocks (docs/studies.md)
    # modules imported before validation that register options (docs/extending.md): plugins=[my_pkg.my_options]
    plugins: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _reject_nonfinite(self)
        self.study.check_seed(self.seed)  # a confirm-block run on explore seeds would be mislabelled
        _require(self.steps >= 1, "steps", self.steps, ">= 1")
        _require(self.eval_every >= 1, "eval_every", self.eval_every, ">= 1")
        # derived generators multiply the seed (evaluation: seed * 1_000_003 + step; rank growth:
        # (seed * 1_000_003 + step) * 100_003 + layer), which must stay inside torch's 64-bit seeds
        _require(0 <= self.seed < MAX_SEED, "seed", self.seed, f"in [0, {MAX_SEED}) (2**24)")
        placement = self.kl_estimator.placement
        v = self.variant
        _require(
            not (placement == KLPlacement.reward and not registry.REFERENCES.meta(v.reference)["per_rollout"]),
            "kl_estimator.placement",
            placement.value,
            f"'loss' with variant {v.name} (reference={v.reference}: A0 recomputes reference logprobs for a "
            "loss term; B has no reference model to fold into the reward)",
        )
        _require(
            not (self.kl_estimator.k2_mode == K2Mode.ref_over_old and placement == KLPlacement.loss),
            "kl_estimator.k2_mode",
            self.kl_estimator.k2_mode.value,
            "'theta_over_ref' with placement=loss (ref_over_old has no gradient w.r.t. theta; it can "
            "only be a reward-side penalty, and it is always logged as kl/k2_ref_over_old)",
        )
        _require(
            self.reset.trigger == "none" or (v.resets and registry.REFERENCES.meta(v.reference)["model"]),
            "reset",
            self.reset.trigger,
            f"'none' with variant {v.name} (reference resets are variant C: variant.resets=true)",
        )
        _require(
            not (self.kl_ctl.kind == KLControlKind.adaptive and self.algo.beta == 0),
            "algo.beta",
            self.algo.beta,
            "> 0 with kl_ctl=adaptive (a multiplicative controller cannot move beta from 0)",
        )
        if self.growth.kind != GrowthKind.none:
            _require(
                self.adapter.kind == AdapterKind.lora,
                "adapter",
                self.adapter.kind.value,
                "'lora' with growth=rank (growth grows the adapter rank)",
            )
            _require(
                self.growth.max_rank > self.adapter.rank,
                "growth.max_rank",
                self.growth.max_rank,
                f"> adapter.rank ({self.adapter.rank})",
            )
            _require(
                self.growth.grow_every > 0 or self.growth.at_reset or self.growth.on_stall,
                "growth.grow_every",
                self.growth.grow_every,
                "> 0, or growth.at_reset / growth.on_stall enabled (otherwise growth never happens)",
            )
        _check_routing(self)
        registry.run_config_checks(self)  # cross-group checks and warnings the options' modules register
        if self.task.name == "reasoning_gym":
            _require(
                self.task.reasoning_gym.prompt_style != PromptStyle.chat or self.model.kind != ModelKind.native,
                "task.reasoning_gym.prompt_style",
                "chat",
                "compact or question with the native character-level policy (chat templates are an HF "
                "tokenizer's: use model=hf_causal_lm)",
            )
        _require(
            self.task.chat_template is None or self.model.kind != ModelKind.native,
            "task.chat_template",
            self.task.chat_template,
            "null with the native character-level policy (chat templates are an HF tokenizer's: model=hf_causal_lm)",
        )
        _require(
            not (registry.TASKS.meta(self.task.name).get("needs_hf", False) and self.model.kind == ModelKind.native),
            "task",
            self.task.name,
            "a task for model=hf_causal_lm: its prompts go through a chat template",
        )
        _require(
            not (self.task.name == "code" and self.model.kind == ModelKind.native),
            "task",
            "code",
            "a task the model can write programs for: task=code needs model=hf_causal_lm (the character-level "
            "policy has no programming vocabulary or context for it)",
        )
        if self.model.kind != ModelKind.native:
            return  # an HF model's context length is checked against its own config when loaded
        max_prompt, max_completion = _task_lengths(self.task, self.algo.max_new_tokens)
        _require(
            max_prompt + max_completion + 1 <= self.model.max_seq_len,
            "model.max_seq_len",
            self.model.max_seq_len,
            f">= {max_prompt + max_completion + 1} for task {self.task.name} with max_len={self.task.max_len}",
        )
        if self.model.positions == "answer":  # half the positions for the prompt (with BOS), half for the answer
            need = 2 * max(max_prompt + 1, max_completion)
            _require(
                need <= self.model.max_seq_len,
                "model.max_seq_len",
                self.model.max_seq_len,
                f">= {need} with model.positions=answer (prompts and completions get half the positions each)",
            )


MAX_SEED = 2**24


registry.set_schema(Config)  # aliases.py reads the defaults through the registry (no import cycle)


def _reject_nonfinite(obj: Any, prefix: str = "") -> None:
    """No float anywhere in the config may be NaN or infinite."""
    for f in fields(obj):
        val = getattr(obj, f.name)
        if is_dataclass(val):
            _reject_nonfinite(val, f"{prefix}{f.name}.")
        elif isinstance(val, float):
            _require(math.isfinite(val), f"{prefix}{f.name}", val, "a finite number")


def _task_lengths(task: TaskConfig, max_new_tokens: int | None = None) -> tuple[int, int]:
    """(longest prompt, completion budget) in tokens: the registered task is built (not imported)."""
    t = registry.build_task(task)
    return t.max_prompt_len, max_new_tokens or t.max_completion_len


def _check_routing(cfg: Config) -> None:
    """The detector / route / adapter combinations a routing study may use (docs/routing.md)."""
    use, dual = cfg.route.use, cfg.adapter.kind == AdapterKind.dual_lora
    _require(
        cfg.detector.name != "none" or cfg.route == RouteConfig(),
        "route",
        f"use={use.value},advantages={cfg.route.advantages.value},penalty={cfg.route.penalty}",
        "the defaults without a detector (detector=none: there are no labels to use)",
    )
    _require(
        cfg.detector.name == "none" or use != RouteUse.route or dual,
        "detector",
        cfg.detector.name,
        "'none' unless adapter=dual_lora (labels route gradients between the retain and forget adapters), "
        "or route.use=filter|penalize|observe",
    )
    _require(
        not (dual and use != RouteUse.route),
        "route.use",
        use.value,
        "'route' with adapter=dual_lora (the filter, penalize and observe baselines train one adapter: adapter=lora)",
    )
    if cfg.route.advantages == RouteAdvantages.split:
        _require(
            registry.ADVANTAGES.meta(cfg.algo.advantage).get("centres_per_group", True),
            "algo.advantage",
            cfg.algo.advantage,
            "a group-local estimator (grpo, rloo, dr_grpo) with route.advantages=split (it normalises "
            "within subsets of each group; a batch-whitened estimator has no per-group form)",
        )


def register_configs() -> None:
    """Register the schema so ``conf/config.yaml`` can list ``base_config`` first in its defaults.
    (``prorl-bench --help``'s key list is ``confhelp.register_help``'s, called by the CLI.)"""
    register_resolvers()  # ${prorl_bench_sweeps:} in hydra.searchpath (conf/config.yaml)
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)


# Keys a named grid adds at the top level through `+group=option` (content packaged _global_).
GRID_KEYS = {"sweep", "arm", "kl_setup"}


def _unknown_keys(node: Any, schema: Any, prefix: str = "") -> list[str]:
    """Keys of the composed config that the dataclass schema does not have (free-form dicts skipped)."""
    if not is_dataclass(schema) or not isinstance(node, DictConfig):
        return []
    names = {f.name for f in fields(schema)}
    bad = []
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in names:
            if not (prefix == "" and key in GRID_KEYS):
                bad.append(path)
            continue
        bad += _unknown_keys(node._get_node(key), getattr(schema, key), f"{path}.")
    return bad


def _suggest(path: str, value: Any = None) -> str:
    import difflib

    from prorl_bench.cli.aliases import translate  # TRL / verl names: one table, also used before Hydra

    hint = translate(path, str(value), {}, frozenset(f.name for f in fields(Config)))
    if hint is not None:
        return "; " + hint.message(path).split(": ", 1)[-1]
    leaf = path.rsplit(".", 1)[-1]
    parent = path.rsplit(".", 1)[0] if "." in path else ""
    schema: Any = Config()
    for part in [p for p in parent.split(".") if p]:
        schema = getattr(schema, part, None)
    if is_dataclass(schema):
        close = difflib.get_close_matches(leaf, [f.name for f in fields(schema)], n=3, cutoff=0.6)
        if close:
            return "; did you mean " + " or ".join(f"{parent + '.' if parent else ''}{c}" for c in close) + "?"
    return ""


def to_config(cfg: DictConfig) -> Config:
    """Validate a composed config and return typed dataclasses (raises ConfigError).

    Unknown keys are an error however they arrive: Hydra lets ``+algo.learning_rate=1e-5`` add a key
    the schema does not have, and ``OmegaConf.to_object`` would then drop it silently — the run would
    train with the default and record the override as applied.
    """
    registry.load_plugins(cfg.get("plugins") or [])  # their options must exist before validation
    unknown = _unknown_keys(cfg, Config())
    if unknown:
        raise ConfigError(
            "unknown config key"
            + ("s " if len(unknown) > 1 else " ")
            + ", ".join(f"{k}{_suggest(k, OmegaConf.select(cfg, k))}" for k in unknown)
            + " (see `prorl-bench --cfg job` for every key)"
        )
    try:
        obj = OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except Exception as e:  # OmegaConf validation (type, enum, missing key)
        raise ConfigError(str(e)) from e
    if not isinstance(obj, Config):
        raise ConfigError(f"composed config is {type(obj).__name__}, expected Config")
    return obj

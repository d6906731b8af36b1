"""``variant``, ``kl_estimator``, ``algo`` and ``kl_ctl``: the RL algorithm and its KL term."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prorl_bench import registry
from prorl_bench.config.enums import AdamWImpl, KLControlKind, KLPlacement, LossAgg
from prorl_bench.config.options import bind_params

_require = registry.require  # ConfigError "invalid config value key=value: allowed ..." unless ok


@dataclass
class VariantConfig:
    """A variant is a named preset over two axes: the reference strategy and whether the reference
    may be reset. A0-C are fixed presets (conf/variant); another combination needs another name."""

    name: str = "A1"  # the output label: A0 | A1 | A2 | B | C (docs/configuration.md#variants), or your own name
    # where reference logprobs come from (registry.REFERENCES): recompute | cached | buffered | none
    reference: str = "cached"
    resets: bool = False  # the reference may be reset (reset.trigger); the C preset
    params: Any = None  # the reference strategy's parameters (its dataclass instance; flat keys variant.<name>)

    @classmethod
    def preset(cls, name: str) -> VariantConfig:
        """The named preset (A0, A1, A2, B or C) as conf/variant/NAME.yaml states it."""
        reference, resets = VARIANT_PRESETS[name]
        return cls(name=name, reference=reference, resets=resets)

    def __post_init__(self) -> None:
        self.params = bind_params(registry.REFERENCES, self.reference, self.params)
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

    name: str = "k3"  # a registered estimator (registry.KL_ESTIMATORS; builtin_options.py declares the built-ins)
    # loss: beta*KL in the loss (GRPO); reward: -beta*KL folded into the reward (PPO-RLHF)
    placement: KLPlacement = KLPlacement.loss
    log_ratio_clamp: float = 20.0  # |logp_theta - logp_ref| clamped before exp (verl/NeMo RL)
    kl_clamp: float = 10.0  # estimators registered clamped=True (k3): per-token value clamped to +-kl_clamp (kl.py)
    params: Any = None  # the estimator's parameters (its dataclass instance; flat keys kl_estimator.<name>)

    def __post_init__(self) -> None:
        _require(self.log_ratio_clamp > 0, "kl_estimator.log_ratio_clamp", self.log_ratio_clamp, "> 0")
        _require(self.kl_clamp > 0, "kl_estimator.kl_clamp", self.kl_clamp, "> 0")
        self.params = bind_params(registry.KL_ESTIMATORS, self.name, self.params)
        _require(
            not (registry.KL_ESTIMATORS.meta(self.name).get("reward_only") and self.placement == KLPlacement.loss),
            "kl_estimator.placement",
            self.placement.value,
            f"'reward' with {self.name} (as a loss its expected gradient is zero; use an estimator such as k2/k3 "
            "in the loss)",
        )


@dataclass
class AlgoConfig:
    """RL algorithm knobs. lr in AdamW units; beta multiplies the KL term."""

    advantage: str = "grpo"  # a registered estimator (registry.ADVANTAGES; builtin_options.py declares the built-ins)
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
    # schema default (Python API); a composed run takes its regime's (conf/regime/v2.yaml: 1e-4)
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
    params: Any = None  # the estimator's parameters (its dataclass instance; flat keys algo.<name>)

    def __post_init__(self) -> None:
        self.params = bind_params(registry.ADVANTAGES, self.advantage, self.params)
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
class AdaptiveKLParams:
    """``kl_ctl=adaptive``: a target-KL controller (PPO / verl): beta rises above the target KL, falls below it."""

    target: float = 0.05  # target KL per token (nats, kl/ref)
    horizon: int = 100  # steps over which a 20% proportional error moves beta by ~20%
    beta_min: float = 1e-5  # lower bound of beta
    beta_max: float = 1.0  # upper bound of beta

    def __post_init__(self) -> None:
        _require(self.target > 0, "kl_ctl.target", self.target, "> 0")
        _require(self.horizon >= 1, "kl_ctl.horizon", self.horizon, ">= 1")
        _require(self.beta_min >= 0, "kl_ctl.beta_min", self.beta_min, ">= 0")
        _require(self.beta_max >= self.beta_min, "kl_ctl.beta_max", self.beta_max, f">= beta_min ({self.beta_min})")


@dataclass
class KLControlConfig:
    """KL coefficient: fixed at algo.beta, or adaptive toward a target (its parameters: ``AdaptiveKLParams``)."""

    # fixed (beta = algo.beta) | adaptive (PPO/verl controller toward kl_ctl.target)
    kind: KLControlKind = KLControlKind.fixed
    params: Any = None  # the kind's parameters (AdaptiveKLParams for adaptive; flat keys kl_ctl.<key>)

    def __post_init__(self) -> None:
        self.params = bind_params(registry.KL_CONTROLLERS, self.kind, self.params)  # an unknown name: ConfigError
        self.kind = KLControlKind(self.kind)  # a name given as text (Python API) is the enum member

"""``reset``, ``opt_reset`` and ``growth``: what happens to the reference, the optimizer state and the
adapter rank during a run (variant C's resets, rank growth)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prorl_bench import registry
from prorl_bench.config.enums import GrowthKind, Migration, StallMetric, StepPolicy

_require = registry.require  # ConfigError "invalid config value key=value: allowed ..." unless ok


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

"""``reset``, ``opt_reset`` and ``growth``: what happens to the reference, the optimizer state and the
adapter rank during a run (variant C's resets, rank growth)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prorl_bench import registry
from prorl_bench.config.enums import GrowthKind, Migration, ResetSource, StallMetric, StepPolicy
from prorl_bench.config.options import bind_params

_require = registry.require  # ConfigError "invalid config value key=value: allowed ..." unless ok


@dataclass
class ResetConfig:
    """Reference-reset trigger (variant C). ``min_spacing``: no two resets closer than this (steps).

    The trigger's own parameters are flat keys of this section (``reset.every`` for periodic,
    ``reset.kl_threshold`` for kl_spike): each trigger registers a dataclass of them (rl/resets.py);
    ``params`` holds its checked instance (``config/options.py`` moves the keys there)."""

    trigger: str = "none"  # a registered trigger (registry.RESET_TRIGGERS; resets.py has the built-ins)
    # held-out metric fed to the trigger (stall) and to growth.on_stall: success_greedy | success_sampled | reward_mean
    metric: StallMetric = StallMetric.success_greedy
    # what a reset does, whatever triggers it: pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref.
    # null = the trigger's default (1, a copy; polyak 0.6 = TRL ref_model_mixup_alpha)
    alpha: float | None = None
    min_spacing: int = 0  # no two resets closer than this (steps); a condition inside it is dropped
    # the weights a reset moves pi_ref toward (its pi_theta): current = the policy at the reset; best = the
    # policy at the regular held-out evaluation with the highest pass@1 so far (ProRL v2; ties: the
    # earliest; before the first evaluation: current, and the reset event says so)
    source: ResetSource = ResetSource.current
    restore_beta: bool = False  # reset the adaptive KL coefficient to its initial value
    params: Any = None  # the trigger's parameters (its dataclass instance; flat keys reset.<name>)

    def __post_init__(self) -> None:
        _require(self.min_spacing >= 0, "reset.min_spacing", self.min_spacing, ">= 0")
        _require(self.alpha is None or 0 < self.alpha <= 1, "reset.alpha", self.alpha, "null or in (0, 1]")
        self.params = bind_params(registry.RESET_TRIGGERS, self.trigger, self.params)
        registry.RESET_TRIGGERS[self.trigger].validate(self)  # the trigger's own requirements


@dataclass
class OptResetConfig:
    """What a reset does to AdamW's state. Every kind states its ``step`` policy explicitly.

    ``rewarmup_steps`` > 0 ramps the LR linearly from lr/N back to lr over N steps after a reset.
    The transform's own parameters are flat keys of this section (``opt_reset.factor`` for soft,
    ``opt_reset.m_factor``/``v_factor`` for asym; rl/opt_state.py); ``params`` holds their instance.
    """

    kind: str = "keep"  # a registered transform (registry.OPT_TRANSFORMS; opt_state.py has the built-ins)
    step: StepPolicy = StepPolicy.keep  # keep | reset AdamW's step counter (bias correction) at a reset
    rewarmup_steps: int = 0  # after a reset ramp the LR from lr/N back to lr over N steps (0 = off)
    params: Any = None  # the transform's parameters (its dataclass instance; flat keys opt_reset.<name>)

    def __post_init__(self) -> None:
        _require(self.rewarmup_steps >= 0, "opt_reset.rewarmup_steps", self.rewarmup_steps, ">= 0")
        self.params = bind_params(registry.OPT_TRANSFORMS, self.kind, self.params)
        # a transform may fix the step policy (hard must equal a fresh optimizer; keep changes nothing)
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

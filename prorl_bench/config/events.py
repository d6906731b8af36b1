"""``reset``, ``opt_reset`` and ``growth``: what happens to the reference, the optimizer state and the
adapter rank during a run (variant C's resets, rank growth)."""

from __future__ import annotations

import warnings
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
    ``reset.kl_threshold`` for kl_spike): each trigger declares a dataclass of them (builtin_options.py);
    ``params`` holds its checked instance (``config/options.py`` moves the keys there)."""

    trigger: str = "none"  # a registered trigger (registry.RESET_TRIGGERS; builtin_options.py declares the built-ins)
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
        validate = registry.RESET_TRIGGERS.hook(self.trigger, "validate")  # the trigger's own requirements
        if validate is not None:
            validate(self)


@dataclass
class OptResetConfig:
    """What a reset does to AdamW's state. Every kind states its ``step`` policy explicitly.

    ``rewarmup_steps`` > 0 ramps the LR linearly from lr/N back to lr over N steps after a reset.
    The transform's own parameters are flat keys of this section (``opt_reset.factor`` for soft,
    ``opt_reset.m_factor``/``v_factor`` for asym; builtin_options.py); ``params`` holds their instance.
    """

    kind: str = "keep"  # a registered transform (registry.OPT_TRANSFORMS; builtin_options.py has the built-ins)
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
class RankGrowthParams:
    """``growth=rank``: adapter rank growth by ``rank_step`` up to ``max_rank`` (every N steps / at resets / on
    stall)."""

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
        _require(
            self.grow_every > 0 or self.at_reset or self.on_stall,
            "growth.grow_every",
            self.grow_every,
            "> 0, or growth.at_reset / growth.on_stall enabled (otherwise growth never happens)",
        )


@dataclass
class GrowthConfig:
    """Topology growth during RL: ``none``, or ``rank`` (its parameters: ``RankGrowthParams``, flat keys)."""

    kind: GrowthKind = GrowthKind.none  # none | rank (adapter rank growth)
    params: Any = None  # the kind's parameters (RankGrowthParams for rank; flat keys growth.<key>)

    def __post_init__(self) -> None:
        self.params = bind_params(registry.GROWTH, self.kind, self.params)  # an unknown name: ConfigError
        self.kind = GrowthKind(self.kind)  # a name given as text (Python API) is the enum member


# --------------------------------------------------------------------------- config checks of reset and opt_reset
# (they read what the options declare: a transform's factors, a trigger's period; config/builtin_options.py)


def transform_factors(cfg: Any) -> tuple[float, float, bool]:
    """(m factor, v factor, whether ``step`` is reset) of the configured transform (``opt_reset``), its
    parameters bound (pure)."""
    m, v, forced = registry.OPT_TRANSFORMS.build(cfg.kind, cfg.params)()
    return m, v, cfg.step == StepPolicy.reset if forced is None else forced


FREQUENT_RESETS = 25  # steps: at or below this period the step-counter hazard compounds (measured)


class StepCounterHazardWarning(UserWarning):
    """soft/asym shrinks Adam's v while keeping its step counter, at frequent resets."""


def step_counter_hazard(r: Any, o: Any) -> str | None:
    """The warning text when ``o`` (an OptResetConfig) scales Adam's v down while keeping its step counter
    and ``r``'s trigger resets on a clock of at most ``FREQUENT_RESETS`` steps (else None). Reads what the
    options declare: the transform's factors and step policy, the trigger's ``period``. TRL's
    ``ReferenceResetCallback`` warns with the same text."""
    _, v_scale, reset_step = transform_factors(o)  # once, at config time
    period = _period(r)
    if v_scale < 1.0 and not reset_step and period is not None and period <= FREQUENT_RESETS:
        return (
            f"opt_reset={o.kind} scales Adam's v by {v_scale} with opt_reset.step={StepPolicy.keep.value}, and "
            f"resets come every {period} steps: the effective step size ratchets up at each reset (measured: "
            "learning collapses). Use opt_reset.step=reset, opt_reset=hard, or less frequent resets."
        )
    return None


@registry.config_check
def warn_step_counter_hazard(cfg: Any) -> None:
    """Scaling Adam's second moment v down while keeping ``step`` removes the bias correction's
    compensation: each reset multiplies the effective step size, and v recovers only at (1 - beta2)
    per step. Repeated every <= 25 steps it collapsed learning (success 0.000 vs 0.61-0.70 for hard,
    3 of 3 seeds; a 10-step LR re-warm-up did not absorb it). Warn at config time (``step_counter_hazard``)."""
    why = step_counter_hazard(cfg.reset, cfg.opt_reset) if cfg.variant.resets else None
    if why is not None:
        warnings.warn(why, StepCounterHazardWarning, stacklevel=4)


def _period(reset: Any) -> int | None:
    """The selected trigger's ``period`` (steps between clocked resets), None when it declares none."""
    period_of = registry.RESET_TRIGGERS.hook(reset.trigger, "period")
    return None if period_of is None else period_of(reset)


class ResetSourceWarning(UserWarning):
    """reset.source=best with resets that come before the first held-out evaluation."""


@registry.config_check
def check_reset_source(cfg: Any) -> None:
    """``reset.source=best`` (rl/best.py) keeps a snapshot of the trainable parameters, which rank growth
    would reshape (refused); a clocked trigger firing before the first regular evaluation
    (``eval_every``) makes the first resets fall back to the current policy (warned)."""
    r = cfg.reset
    if r.source != ResetSource.best or r.trigger == "none":
        return
    _require(
        cfg.growth.kind == GrowthKind.none,
        "reset.source",
        r.source.value,
        "'current' with growth=rank (the best snapshot holds the adapters at the rank of its evaluation)",
    )
    period = _period(r)
    if period is not None and period < cfg.eval_every:
        warnings.warn(
            f"reset.source=best: reset.trigger={r.trigger} resets every {period} steps but the first held-out "
            f"evaluation is at step eval_every={cfg.eval_every}: resets before it copy the current policy "
            "(their events say source=current with source_reason). Evaluate at least as often as you reset.",
            ResetSourceWarning,
            stacklevel=4,
        )

"""Reference resets: when to reset (registered triggers) and what a reset does to pi_ref.

Triggers are small state machines fed one step at a time (``observe_step``) and one held-out
evaluation at a time (``observe_validation``); ``ResetSchedule.due(step)`` returns the reason for a
reset or None. They are pure Python (no torch), so they are unit-tested on synthetic metric streams.
A global ``min_spacing`` suppresses a reset closer than that to the previous one. What a reset does
is ``reset_reference`` with ``ResetSchedule.alpha`` (1 = a copy).

A trigger states what the rest of the bench needs to know about it: ``period(cfg)`` (it fires every
N steps whatever the run does, which the step-counter warning below reads), its own parameters
(``@RESET_TRIGGERS.register(name, params=MyParams)``: the dataclass's fields are flat keys of the
``reset`` section, ``reset.every``; the checked instance is ``self.params``), and its checkpointed
``STATE``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from prorl_bench.config import Config, GrowthKind, ResetConfig, ResetSource, StepPolicy
from prorl_bench.registry import RESET_TRIGGERS, config_check, require
from prorl_bench.rl.opt_state import transform_factors


class Trigger:
    """When to reset: fed one step (``observe_step``) and one held-out evaluation
    (``observe_validation``) at a time; ``fire(step)`` returns a reason or None.

    Adding a trigger: subclass, decorate with ``@RESET_TRIGGERS.register("name")`` and select it
    with ``reset.trigger=name``; ``validate`` states its config requirements (ConfigError). What a
    reset *does* (copy, or an alpha-mix) is ``reset.alpha``, independent of the trigger; ``alpha``
    below is only the trigger's default for it.
    """

    alpha = 1.0  # default pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref when reset.alpha is null
    STATE: tuple[str, ...] = ()  # attributes saved in checkpoints

    def __init__(self, cfg: ResetConfig, params: Any = None) -> None:
        self.cfg = cfg
        self.name = cfg.trigger
        self.params = params  # its dataclass instance, bound by RESET_TRIGGERS.build (None: it declares none)

    @classmethod
    def validate(cls, cfg: ResetConfig) -> None:
        """Raise ConfigError if ``cfg`` lacks what this trigger needs beyond its own parameters (their
        dataclass checks those: ``cfg.params`` is its instance)."""

    @classmethod
    def period(cls, cfg: ResetConfig) -> int | None:
        """Steps between resets when the trigger fires on a clock (whatever the run's signals), else
        None. Frequent clocked resets compound the step-counter hazard (``warn_step_counter_hazard``)."""
        return None

    def observe_step(self, step: int, kl_ref: float | None) -> None:
        """The step's KL to the reference (nats/token), None without a reference."""

    def observe_validation(self, value: float) -> None:
        """One held-out evaluation of ``reset.metric`` (regular evaluations only)."""

    def fire(self, step: int) -> str | None:
        """Reason for a reset at the end of ``step``, or None; consumes a pending condition."""
        return None

    def on_reset(self) -> None:
        """The reference was reset: statistics relative to the old reference start over."""


@RESET_TRIGGERS.register("none")
class Never(Trigger):
    """No resets (variants A0-A2 and B, and C without resets)."""


@dataclass
class PeriodicParams:
    every: int = 50  # steps between resets (periodic, polyak)

    def __post_init__(self) -> None:
        require(self.every >= 1, "reset.every", self.every, ">= 1")


@RESET_TRIGGERS.register("periodic", params=PeriodicParams)
class Periodic(Trigger):
    """Every ``reset.every`` steps."""

    @classmethod
    def period(cls, cfg: ResetConfig) -> int | None:
        return cfg.params.every

    def fire(self, step: int) -> str | None:
        every = self.params.every
        return f"{self.name}: every {every} steps" if step % every == 0 else None


@RESET_TRIGGERS.register("polyak", params=PeriodicParams)
class Polyak(Periodic):
    """TRL's ``sync_ref_model``: every ``reset.every`` steps with a default mix of ``reset.alpha``
    = 0.6 (``ref_model_mixup_alpha``)."""

    alpha = 0.6


@dataclass
class KLSpikeParams:
    kl_threshold: float | None = None  # absolute threshold on kl/ref (nats/token)
    kl_multiple: float | None = None  # threshold as a multiple of kl/ref's running mean
    kl_ema: float = 0.9  # decay of the running mean of kl/ref
    kl_warmup: int = 5  # steps of running-mean history before kl_multiple applies

    def __post_init__(self) -> None:
        require(self.kl_threshold is None or self.kl_threshold > 0, "reset.kl_threshold", self.kl_threshold,
                "null or > 0")  # fmt: skip
        require(self.kl_multiple is None or self.kl_multiple > 1, "reset.kl_multiple", self.kl_multiple,
                "null or > 1")  # fmt: skip
        require(0 <= self.kl_ema < 1, "reset.kl_ema", self.kl_ema, "in [0, 1)")
        require(self.kl_warmup >= 0, "reset.kl_warmup", self.kl_warmup, ">= 0")
        require(self.kl_threshold is not None or self.kl_multiple is not None, "reset.kl_threshold",
                self.kl_threshold, "a value (or reset.kl_multiple) when reset.trigger=kl_spike")  # fmt: skip


@RESET_TRIGGERS.register("kl_spike", params=KLSpikeParams)
class KLSpike(Trigger):
    """KL to the reference above ``kl_threshold``, or above ``kl_multiple`` x its running mean
    (EMA with decay ``kl_ema``, after ``kl_warmup`` steps of history)."""

    STATE = ("kl_mean", "kl_seen", "_pending")

    def __init__(self, cfg: ResetConfig, params: KLSpikeParams) -> None:
        super().__init__(cfg, params)
        self.kl_mean: float | None = None
        self.kl_seen = 0
        self._pending: str | None = None

    def observe_step(self, step: int, kl_ref: float | None) -> None:
        c = self.params
        if kl_ref is None or math.isnan(kl_ref):
            return
        if c.kl_threshold is not None and kl_ref > c.kl_threshold:
            self._pending = f"kl_spike: kl/ref={kl_ref:.4g} > threshold {c.kl_threshold:g}"
        elif (
            c.kl_multiple is not None
            and self.kl_mean is not None
            and self.kl_seen >= c.kl_warmup
            and kl_ref > c.kl_multiple * self.kl_mean
        ):
            self._pending = f"kl_spike: kl/ref={kl_ref:.4g} > {c.kl_multiple:g} x running mean {self.kl_mean:.4g}"
        # the running mean excludes the spike it is compared with
        self.kl_mean = kl_ref if self.kl_mean is None else c.kl_ema * self.kl_mean + (1 - c.kl_ema) * kl_ref
        self.kl_seen += 1

    def fire(self, step: int) -> str | None:
        reason, self._pending = self._pending, None
        return reason

    def on_reset(self) -> None:
        self.kl_mean, self.kl_seen = None, 0


@dataclass
class StallParams:
    patience: int = 2  # evaluations without improvement before a reset
    min_delta: float = 0.0  # an improvement must exceed the best by more than this

    def __post_init__(self) -> None:
        require(self.patience >= 1, "reset.patience", self.patience, ">= 1")
        require(self.min_delta >= 0, "reset.min_delta", self.min_delta, ">= 0")


@RESET_TRIGGERS.register("stall", params=StallParams)
class Stall(Trigger):
    """``reset.metric`` has not improved on its best by more than ``min_delta`` for ``patience``
    evaluations."""

    STATE = ("best", "stale", "_pending")

    def __init__(self, cfg: ResetConfig, params: StallParams) -> None:
        super().__init__(cfg, params)
        self.best: float | None = None
        self.stale = 0  # evaluations since the best one
        self._pending: str | None = None

    def observe_validation(self, value: float) -> None:
        if self.best is None or value > self.best + self.params.min_delta:
            self.best, self.stale = value, 0
            return
        self.stale += 1
        if self.stale >= self.params.patience:
            self._pending = (
                f"stall: {self.cfg.metric.value} has not improved on {self.best:.4g} for {self.stale} evaluations"
            )

    def fire(self, step: int) -> str | None:
        reason, self._pending = self._pending, None
        return reason

    def on_reset(self) -> None:
        self.best, self.stale = None, 0


class ResetSchedule:
    """Decides, at each step boundary, whether the reference is reset and why: the configured
    trigger, with a global ``min_spacing`` (a condition closer than that to the previous reset is
    dropped, not queued). Growth uses the same triggers (growth.py)."""

    def __init__(self, cfg: ResetConfig) -> None:
        self.cfg = cfg
        self.trigger: Trigger = RESET_TRIGGERS.build(cfg.trigger, cfg.params)(cfg)  # its parameters bound once
        self.last_reset = 0  # step of the previous reset (0 = start of training)

    @property
    def alpha(self) -> float:
        """Mixing weight of pi_theta at a reset: ``reset.alpha``, or the trigger's default."""
        return self.trigger.alpha if self.cfg.alpha is None else self.cfg.alpha

    def observe_step(self, step: int, kl_ref: float | None) -> None:
        self.trigger.observe_step(step, kl_ref)

    def observe_validation(self, value: float) -> None:
        self.trigger.observe_validation(value)

    def due(self, step: int) -> str | None:
        """Reason for a reset at the end of ``step``, or None. Consumes the pending condition."""
        reason = self.trigger.fire(step)
        if reason is None:
            return None
        if step - self.last_reset < self.cfg.min_spacing and self.last_reset > 0:
            return None  # too close to the previous reset; the condition is dropped, not queued
        return reason

    def mark_reset(self, step: int) -> None:
        self.last_reset = step
        self.trigger.on_reset()

    def state_dict(self) -> dict[str, Any]:
        return {"last_reset": self.last_reset, **{k: getattr(self.trigger, k) for k in self.trigger.STATE}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_reset = state["last_reset"]
        for k in self.trigger.STATE:
            setattr(self.trigger, k, state[k])


FREQUENT_RESETS = 25  # steps: at or below this period the step-counter hazard compounds (measured)


class StepCounterHazardWarning(UserWarning):
    """soft/asym shrinks Adam's v while keeping its step counter, at frequent resets."""


def step_counter_hazard(r: ResetConfig, o: Any) -> str | None:
    """The warning text when ``o`` (an OptResetConfig) scales Adam's v down while keeping its step
    counter and ``r``'s trigger resets on a clock of at most ``FREQUENT_RESETS`` steps (else None).
    Reads what the options declare: the transform's factors and step policy, the trigger's ``period``."""
    _, v_scale, reset_step = transform_factors(o)
    period = RESET_TRIGGERS[r.trigger].period(r)
    if v_scale < 1.0 and not reset_step and period is not None and period <= FREQUENT_RESETS:
        return (
            f"opt_reset={o.kind} scales Adam's v by {v_scale} with opt_reset.step={StepPolicy.keep.value}, and "
            f"resets come every {period} steps: the effective step size ratchets up at each reset (measured: "
            "learning collapses). Use opt_reset.step=reset, opt_reset=hard, or less frequent resets."
        )
    return None


@config_check
def warn_step_counter_hazard(cfg: Config) -> None:
    """Scaling Adam's second moment v down while keeping ``step`` removes the bias correction's
    compensation: each reset multiplies the effective step size, and v recovers only at (1 - beta2)
    per step. Repeated every <= 25 steps it collapsed learning (success 0.000 vs 0.61-0.70 for hard,
    3 of 3 seeds; a 10-step LR re-warm-up did not absorb it). Warn at config time
    (``step_counter_hazard``; TRL's ``ReferenceResetCallback`` warns with the same text)."""
    why = step_counter_hazard(cfg.reset, cfg.opt_reset) if cfg.variant.resets else None
    if why is not None:
        warnings.warn(why, StepCounterHazardWarning, stacklevel=4)


class ResetSourceWarning(UserWarning):
    """reset.source=best with resets that come before the first held-out evaluation."""


@config_check
def check_reset_source(cfg: Config) -> None:
    """``reset.source=best`` (rl/best.py) keeps a snapshot of the trainable parameters, which rank growth
    would reshape (refused); a clocked trigger firing before the first regular evaluation
    (``eval_every``) makes the first resets fall back to the current policy (warned)."""
    r = cfg.reset
    if r.source != ResetSource.best or r.trigger == "none":
        return
    require(
        cfg.growth.kind == GrowthKind.none,
        "reset.source",
        r.source.value,
        "'current' with growth=rank (the best snapshot holds the adapters at the rank of its evaluation)",
    )
    period = RESET_TRIGGERS[r.trigger].period(r)
    if period is not None and period < cfg.eval_every:
        warnings.warn(
            f"reset.source=best: reset.trigger={r.trigger} resets every {period} steps but the first held-out "
            f"evaluation is at step eval_every={cfg.eval_every}: resets before it copy the current policy "
            "(their events say source=current with source_reason). Evaluate at least as often as you reset.",
            ResetSourceWarning,
            stacklevel=4,
        )


@torch.no_grad()
def reset_reference(
    ref: torch.nn.Module,
    policy: torch.nn.Module,
    alpha: float = 1.0,
    weights: dict[str, torch.Tensor] | None = None,
) -> None:
    """pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref, parameter by parameter (alpha=1: a copy).

    Buffers are copied. Parameter names and shapes must match exactly (fails loudly otherwise).
    A reference that is not a copy of the policy (``reference.AdapterReference``) resets itself.
    ``weights`` (``reset.source=best``: name -> tensor for the policy's trainable parameters, e.g.
    ``best.BestPolicy.weights_for``) stand in for those parameters of ``policy``; the frozen ones and the
    buffers still come from ``policy``.
    """
    if hasattr(ref, "reset_from"):
        ref.reset_from(policy, alpha, weights)
        return
    ref_params = dict(ref.named_parameters())
    pol_params = dict(policy.named_parameters())
    if ref_params.keys() != pol_params.keys():
        missing = sorted(set(pol_params) ^ set(ref_params))[:5]
        raise ValueError(f"reference and policy parameters differ: {missing}")
    if weights is not None:
        trainable = {n for n, p in pol_params.items() if p.requires_grad}
        if weights.keys() != trainable:
            raise ValueError(f"reset weights and the policy's trainable parameters differ: "
                             f"{sorted(set(weights) ^ trainable)[:5]}")  # fmt: skip
    for name, p in pol_params.items():
        r = ref_params[name]
        src = weights[name] if weights is not None and p.requires_grad else p
        if r.shape != src.shape:
            raise ValueError(f"reference parameter {name} has shape {tuple(r.shape)}, policy {tuple(src.shape)}")
        if alpha == 1.0 or not p.requires_grad:
            # a frozen parameter equals its reference copy: mixing would only add rounding
            # (0.4 w + 0.6 w != w in floats), so the frozen base is copied exactly
            r.copy_(src)
        else:
            r.mul_(1.0 - alpha).add_(src, alpha=alpha)
    for b_ref, b_pol in zip(ref.buffers(), policy.buffers()):
        b_ref.copy_(b_pol)

"""Reference resets: when to reset (registered triggers) and what a reset does to pi_ref.

Triggers are small state machines fed one step at a time (``observe_step``) and one held-out
evaluation at a time (``observe_validation``); ``ResetSchedule.due(step)`` returns the reason for a
reset or None. They are pure Python (no torch), so they are unit-tested on synthetic metric streams.
A global ``min_spacing`` suppresses a reset closer than that to the previous one. What a reset does
is ``reset_reference`` with ``ResetSchedule.alpha`` (1 = a copy).

The built-in triggers are declared in ``config/builtin_options.py`` — their descriptions, their
parameters (``PeriodicParams``: flat keys of the ``reset`` section, ``reset.every``; the checked instance
is ``self.params``) and ``period(cfg)`` (they fire every N steps whatever the run does, which the
step-counter warning reads) — and registered here with their code (``@RESET_TRIGGERS.register(name)``).
A plugin trigger states all of it in one registration (``params=``; ``period`` and ``validate`` as
class methods; docs/extending.md). A trigger's checkpointed attributes are its ``STATE``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from prorl_bench.config import ResetConfig
from prorl_bench.config.builtin_options import KLSpikeParams, StallParams
from prorl_bench.config.events import ResetSourceWarning as ResetSourceWarning  # re-exported
from prorl_bench.config.events import StepCounterHazardWarning as StepCounterHazardWarning  # re-exported
from prorl_bench.config.events import step_counter_hazard as step_counter_hazard  # re-exported (TRL callback)
from prorl_bench.registry import RESET_TRIGGERS


class Trigger:
    """When to reset: fed one step (``observe_step``) and one held-out evaluation
    (``observe_validation``) at a time; ``fire(step)`` returns a reason or None.

    Adding a trigger: subclass, decorate with ``@RESET_TRIGGERS.register("name", params=...)`` and
    select it with ``reset.trigger=name``. Config time reads two optional class methods:
    ``validate(reset_cfg)`` states its requirements beyond its own parameters (ConfigError), and
    ``period(reset_cfg)`` the steps between resets when it fires on a clock whatever the run does
    (frequent clocked resets compound the step-counter hazard). What a reset *does* (copy, or an
    alpha-mix) is ``reset.alpha``, independent of the trigger; ``alpha`` below is only the trigger's
    default for it.
    """

    alpha = 1.0  # default pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref when reset.alpha is null
    STATE: tuple[str, ...] = ()  # attributes saved in checkpoints

    def __init__(self, cfg: ResetConfig, params: Any = None) -> None:
        self.cfg = cfg
        self.name = cfg.trigger
        self.params = params  # its dataclass instance, bound by RESET_TRIGGERS.build (None: it declares none)

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


@RESET_TRIGGERS.register("periodic")
class Periodic(Trigger):
    """Every ``reset.every`` steps."""

    def fire(self, step: int) -> str | None:
        every = self.params.every
        return f"{self.name}: every {every} steps" if step % every == 0 else None


@RESET_TRIGGERS.register("polyak")
class Polyak(Periodic):
    """TRL's ``sync_ref_model``: every ``reset.every`` steps with a default mix of ``reset.alpha``
    = 0.6 (``ref_model_mixup_alpha``)."""

    alpha = 0.6


@RESET_TRIGGERS.register("kl_spike")
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


@RESET_TRIGGERS.register("stall")
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

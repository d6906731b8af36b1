"""Reference resets: when to reset (triggers) and what a reset does to pi_ref.

Triggers are small state machines fed one step at a time (``observe_step``) and one held-out
evaluation at a time (``observe_validation``); ``due(step)`` returns the reason for a reset or None.
They are pure Python (no torch), so they are unit-tested on synthetic metric streams. A global
``min_spacing`` suppresses a reset closer than that to the previous one.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from prorl_bench.config import ResetConfig, ResetTrigger


class ResetSchedule:
    """Decides, at each step boundary, whether the reference is reset and why."""

    def __init__(self, cfg: ResetConfig) -> None:
        self.cfg = cfg
        self.last_reset = 0  # step of the previous reset (0 = start of training)
        self.kl_mean: float | None = None
        self.kl_seen = 0
        self.best: float | None = None
        self.stale = 0  # evaluations since the best one
        self._pending: str | None = None

    # -- observations
    def observe_step(self, step: int, kl_ref: float | None) -> None:
        """Feed the step's KL to the reference (nats/token); checks the kl_spike condition."""
        c = self.cfg
        if c.trigger != ResetTrigger.kl_spike or kl_ref is None or math.isnan(kl_ref):
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

    def observe_validation(self, value: float) -> None:
        """Feed one held-out evaluation of ``cfg.metric``; checks the stall condition."""
        if self.cfg.trigger != ResetTrigger.stall:
            return
        if self.best is None or value > self.best + self.cfg.min_delta:
            self.best, self.stale = value, 0
            return
        self.stale += 1
        if self.stale >= self.cfg.patience:
            self._pending = (
                f"stall: {self.cfg.metric.value} has not improved on {self.best:.4g} for {self.stale} evaluations"
            )

    # -- decision
    def due(self, step: int) -> str | None:
        """Reason for a reset at the end of ``step``, or None. Consumes the pending condition."""
        c = self.cfg
        if c.trigger == ResetTrigger.none:
            return None
        if c.trigger in (ResetTrigger.periodic, ResetTrigger.polyak):
            reason = f"{c.trigger.value}: every {c.every} steps" if step % c.every == 0 else None
        else:
            reason, self._pending = self._pending, None
        if reason is None:
            return None
        if step - self.last_reset < c.min_spacing and self.last_reset > 0:
            return None  # too close to the previous reset; the condition is dropped, not queued
        return reason

    def mark_reset(self, step: int) -> None:
        self.last_reset = step
        # after a reset the reference is new: the stall baseline and KL statistics start over
        self.best, self.stale = None, 0
        self.kl_mean, self.kl_seen = None, 0

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("last_reset", "kl_mean", "kl_seen", "best", "stale", "_pending")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)


@torch.no_grad()
def reset_reference(ref: torch.nn.Module, policy: torch.nn.Module, alpha: float = 1.0) -> None:
    """pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref, parameter by parameter (alpha=1: a copy).

    Buffers are copied. Parameter names and shapes must match exactly (fails loudly otherwise).
    A reference that is not a copy of the policy (``reference.AdapterReference``) resets itself.
    """
    if hasattr(ref, "reset_from"):
        ref.reset_from(policy, alpha)
        return
    ref_params = dict(ref.named_parameters())
    pol_params = dict(policy.named_parameters())
    if ref_params.keys() != pol_params.keys():
        missing = sorted(set(pol_params) ^ set(ref_params))[:5]
        raise ValueError(f"reference and policy parameters differ: {missing}")
    for name, p in pol_params.items():
        r = ref_params[name]
        if r.shape != p.shape:
            raise ValueError(f"reference parameter {name} has shape {tuple(r.shape)}, policy {tuple(p.shape)}")
        if alpha == 1.0 or not p.requires_grad:
            # a frozen parameter equals its reference copy: mixing would only add rounding
            # (0.4 w + 0.6 w != w in floats), so the frozen base is copied exactly
            r.copy_(p)
        else:
            r.mul_(1.0 - alpha).add_(p, alpha=alpha)
    for b_ref, b_pol in zip(ref.buffers(), policy.buffers()):
        b_ref.copy_(b_pol)

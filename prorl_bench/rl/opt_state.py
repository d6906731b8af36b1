"""Optimizer-state transforms applied at a reference reset, as pure functions on AdamW state.

AdamW keeps, per parameter, ``step`` (a scalar tensor), ``exp_avg`` (m) and ``exp_avg_sq`` (v).
Every transform states what it does to ``step`` because the bias correction depends on it: with
m = v = 0 but ``step = t0 >> 1`` the corrections 1 - beta^t are ~1 and no longer undo the zero
initialisation, so the first update after such a "reset" is ~(1-b1)/sqrt(1-b2) = 3.2x too large for
(0.9, 0.999) — a hidden LR spike. A *hard* reset therefore also sets step = 0, which makes it
bit-identical to a freshly built optimizer (tested).

The transforms themselves (``opt_reset.kind``: keep, hard, soft, asym) are pure functions of their
parameters — the factors applied to m and v and whether ``step`` is reset — registered with their
declarations in ``config/builtin_options.py`` (``config/events.py``'s ``transform_factors`` reads them);
here they are applied to the optimizer's tensors.

Unknown state layouts (another optimizer, amsgrad, fused variants with extra keys) fail loudly.
"""

from __future__ import annotations

from typing import Any

import torch

from prorl_bench.config import OptResetConfig
from prorl_bench.config.events import transform_factors as transform_factors  # re-exported

ADAMW_KEYS = frozenset({"step", "exp_avg", "exp_avg_sq"})


def check_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Raise if the optimizer is not AdamW/Adam with exactly the state layout the transforms know."""
    if not isinstance(optimizer, (torch.optim.AdamW, torch.optim.Adam)):
        raise TypeError(f"optimizer-state transforms support Adam/AdamW, got {type(optimizer).__name__}")
    for group in optimizer.param_groups:
        if group.get("amsgrad"):
            raise ValueError("optimizer-state transforms do not handle amsgrad (max_exp_avg_sq)")
    for p, state in optimizer.state.items():
        keys = set(state)
        if keys and keys != ADAMW_KEYS:
            raise ValueError(
                f"unknown optimizer state layout for a parameter of shape {tuple(p.shape)}: keys {sorted(keys)}, "
                f"expected {sorted(ADAMW_KEYS)}"
            )


@torch.no_grad()
def scale_moments(optimizer: torch.optim.Optimizer, m_factor: float, v_factor: float, reset_step: bool) -> None:
    """m <- m_factor * m, v <- v_factor * v for every parameter; optionally step <- 0."""
    check_adam_state(optimizer)
    for state in optimizer.state.values():
        if not state:
            continue
        state["exp_avg"].mul_(m_factor)
        state["exp_avg_sq"].mul_(v_factor)
        if reset_step:
            state["step"].zero_()


def apply_opt_reset(optimizer: torch.optim.Optimizer, cfg: OptResetConfig) -> dict[str, Any]:
    """Apply the configured transform in place. Returns a description for the reset event.

    A transform that changes nothing (m = v = 1, step kept) only checks the state layout, so
    ``keep`` leaves the optimizer's tensors bit-for-bit untouched.
    """
    m, v, reset_step = transform_factors(cfg)
    if m == 1.0 and v == 1.0 and not reset_step:
        check_adam_state(optimizer)
    else:
        scale_moments(optimizer, m, v, reset_step)
    return {"opt_reset": cfg.kind, "m_factor": m, "v_factor": v, "step_reset": reset_step}


def moment_norms(optimizer: torch.optim.Optimizer) -> tuple[float, float]:
    """Global L2 norms of m and v (diagnostics around resets)."""
    m2 = v2 = 0.0
    for state in optimizer.state.values():
        if state:
            m2 += float(state["exp_avg"].double().square().sum())
            v2 += float(state["exp_avg_sq"].double().square().sum())
    return m2**0.5, v2**0.5

"""Optimizer-state transforms applied at a reference reset, as pure functions on AdamW state.

AdamW keeps, per parameter, ``step`` (a scalar tensor), ``exp_avg`` (m) and ``exp_avg_sq`` (v).
Every transform states what it does to ``step`` because the bias correction depends on it: with
m = v = 0 but ``step = t0 >> 1`` the corrections 1 - beta^t are ~1 and no longer undo the zero
initialisation, so the first update after such a "reset" is ~(1-b1)/sqrt(1-b2) = 3.2x too large for
(0.9, 0.999) — a hidden LR spike. A *hard* reset therefore also sets step = 0, which makes it
bit-identical to a freshly built optimizer (tested).

Unknown state layouts (another optimizer, amsgrad, fused variants with extra keys) fail loudly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from prorl_bench.config import OptResetConfig, StepPolicy
from prorl_bench.registry import OPT_TRANSFORMS, require

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


# Transforms: () -> (m_factor, v_factor, reset_step or None to follow opt_reset.step), called with
# ``params=<instance>`` when registered with a params dataclass. Register another with
# ``@OPT_TRANSFORMS.register(name, step=None|"keep"|"reset", why=..., params=...)``; ``step`` fixes the
# step policy the config must state (checked at config time with ``why`` as the reason); the
# dataclass's fields are flat keys of the ``opt_reset`` section (``opt_reset.factor``).
@OPT_TRANSFORMS.register("keep", step="keep", why="keep changes nothing")
def keep() -> tuple[float, float, bool | None]:
    """ProRL v2: the optimizer is untouched."""
    return 1.0, 1.0, None


@OPT_TRANSFORMS.register("hard", step="reset", why="a hard reset must equal a freshly built optimizer")
def hard() -> tuple[float, float, bool | None]:
    """ProRL v1: m = v = 0 and step = 0 (= a fresh optimizer; the LR schedule restarts)."""
    return 0.0, 0.0, True


def _unit(value: float, key: str) -> None:
    require(0.0 <= value <= 1.0, key, value, "in [0, 1]")


@dataclass
class SoftParams:
    factor: float = 0.1  # m and v scaled by this at a reset

    def __post_init__(self) -> None:
        _unit(self.factor, "opt_reset.factor")


@OPT_TRANSFORMS.register("soft", params=SoftParams)
def soft(params: SoftParams) -> tuple[float, float, bool | None]:
    """m <- f m, v <- f v with f = opt_reset.factor."""
    return params.factor, params.factor, None


@dataclass
class AsymParams:
    m_factor: float = 0.0  # first moment scaled by this at a reset
    v_factor: float = 1.0  # second moment scaled by this at a reset

    def __post_init__(self) -> None:
        _unit(self.m_factor, "opt_reset.m_factor")
        _unit(self.v_factor, "opt_reset.v_factor")


@OPT_TRANSFORMS.register("asym", params=AsymParams)
def asym(params: AsymParams) -> tuple[float, float, bool | None]:
    """m <- f_m m, v <- f_v v (e.g. forget the direction, keep the curvature)."""
    return params.m_factor, params.v_factor, None


def transform_factors(cfg: OptResetConfig) -> tuple[float, float, bool]:
    """(m factor, v factor, whether ``step`` is reset) of the configured transform, its parameters bound (pure)."""
    m, v, forced = OPT_TRANSFORMS.build(cfg.kind, cfg.params)()
    return m, v, cfg.step == StepPolicy.reset if forced is None else forced


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

"""Dual (retain / forget) LoRA adapters for gradient routing (docs/routing.md).

``DualLoRALinear`` wraps an ``nn.Linear``:
    y = base(x) + s_r * c_r * (x A_r^T B_r^T) + s_f * c_f * (x A_f^T B_f^T)
with c = alpha / rank fixed at attach time and (s_r, s_f) the inference scales set by
``adapter_scales`` (``both`` = (1, 1), ``retain_only`` = (1, 0), ``forget_only`` = (0, 1), or any
pair; ``fold_dual`` folds them into the base weights for export).

Routing is a single pass with a per-sample stop-gradient: inside ``route_rows(model, mask)``
(mask: bool, shape (batch,), True = labelled hack sample) the retain path of labelled rows is
computed with detached retain parameters, so forward values are unchanged and the retain
adapter gets exactly zero gradient from
those rows, while the forget adapter (and the retain adapter on unlabelled rows) learn as usual.
One pass was chosen over homogeneous sub-batches because the loss of a mixed minibatch is then
literally the same expression as without routing (no re-normalisation across sub-batches).
Rank growth is not supported for dual adapters (``check_growth`` raises).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn as nn

from prorl_bench.models.lora import LoRALinear, adapted_shape, wrap_linears

SCALE_MODES: dict[str, tuple[float, float]] = {
    "both": (1.0, 1.0),
    "retain_only": (1.0, 0.0),
    "forget_only": (0.0, 1.0),
}


class DualLoRALinear(nn.Module):
    def __init__(self, base: nn.Module, retain_rank: int, forget_rank: int, alpha: float, freeze_base: bool) -> None:
        super().__init__()
        if retain_rank < 1 or forget_rank < 1:
            raise ValueError(f"dual_lora ranks must be >= 1, got retain={retain_rank} forget={forget_rank}")
        self.base = base
        self.retain_scaling = alpha / retain_rank
        self.forget_scaling = alpha / forget_rank
        init = LoRALinear._init_rows
        fan_in, fan_out = adapted_shape(base)  # nn.Linear or GPT-2's Conv1D
        self.lora_retain_A = nn.Parameter(init(retain_rank, fan_in, base.weight))
        self.lora_retain_B = nn.Parameter(base.weight.new_zeros(fan_out, retain_rank))
        self.lora_forget_A = nn.Parameter(init(forget_rank, fan_in, base.weight))
        self.lora_forget_B = nn.Parameter(base.weight.new_zeros(fan_out, forget_rank))
        self.scales: tuple[float, float] = (1.0, 1.0)
        self.row_mask: torch.Tensor | None = None  # (batch,) bool, True = detach retain path
        if freeze_base:
            base.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s_r, s_f = self.scales
        out = self.base(x)
        if s_r != 0.0:
            r = (self.retain_scaling * s_r) * ((x @ self.lora_retain_A.t()) @ self.lora_retain_B.t())
            if self.row_mask is not None:
                if self.row_mask.shape[0] != x.shape[0]:
                    raise ValueError(f"route mask has {self.row_mask.shape[0]} rows, batch has {x.shape[0]}")
                # detach the retain *parameters* (not x) on labelled rows, so gradient still
                # reaches earlier layers' forget adapters through this layer's retain path
                m = self.row_mask.view(-1, *([1] * (x.dim() - 1)))
                a, b = self.lora_retain_A.detach(), self.lora_retain_B.detach()
                r_det = (self.retain_scaling * s_r) * ((x @ a.t()) @ b.t())
                r = torch.where(m, r_det, r)
            out = out + r
        if s_f != 0.0:
            out = out + (self.forget_scaling * s_f) * ((x @ self.lora_forget_A.t()) @ self.lora_forget_B.t())
        return out


def attach_dual_lora(
    model: nn.Module, targets: list[str], retain_rank: int, forget_rank: int, alpha: float, freeze_base: bool
) -> int:
    """Replace every ``nn.Linear`` named in ``targets`` by a DualLoRALinear (same matching as LoRA)."""
    return wrap_linears(
        model, targets, lambda base: DualLoRALinear(base, retain_rank, forget_rank, alpha, freeze_base), freeze_base
    )


def dual_layers(model: nn.Module) -> list[DualLoRALinear]:
    return [m for m in model.modules() if isinstance(m, DualLoRALinear)]


# the names the tools (prorl-bench-sample / -export --mode) accept, short and long
MODE_ALIASES = {"retain": "retain_only", "forget": "forget_only", "both": "both"}


def resolve_scales(mode: str | tuple[float, float]) -> tuple[float, float]:
    """(retain, forget) scales of a mode name (``both``, ``retain_only``/``retain``,
    ``forget_only``/``forget``) or of an explicit pair (any finite floats)."""
    if isinstance(mode, tuple):
        if len(mode) != 2 or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in mode):
            raise ValueError(f"adapter scales must be two finite numbers (retain, forget), got {mode!r}")
        return float(mode[0]), float(mode[1])
    name = MODE_ALIASES.get(mode, mode)
    if name not in SCALE_MODES:
        raise ValueError(
            f"unknown adapter scale mode {mode!r}; choose from {sorted(SCALE_MODES)} or {sorted(MODE_ALIASES)}"
        )
    return SCALE_MODES[name]


def parse_scales(text: str) -> tuple[float, float]:
    """``"a,b"`` -> (a, b): the tools' ``--scales`` (retain scale, forget scale)."""
    parts = text.split(",")
    try:
        pair = tuple(float(x) for x in parts)
    except ValueError:
        pair = ()
    if len(pair) != 2 or not all(math.isfinite(x) for x in pair):
        raise ValueError(f"--scales {text!r}: expected two finite numbers 'retain,forget', e.g. 1,0")
    return pair  # type: ignore[return-value]


@contextlib.contextmanager
def adapter_scales(model: nn.Module, mode: str | tuple[float, float]) -> Iterator[None]:
    """Set (retain, forget) scales of every dual layer for the block: a mode name (``SCALE_MODES``,
    or a ``MODE_ALIASES`` short name) or an explicit (retain, forget) pair."""
    scales = resolve_scales(mode)
    layers = dual_layers(model)
    old = [m.scales for m in layers]
    for m in layers:
        m.scales = scales
    try:
        yield
    finally:
        for m, s in zip(layers, old):
            m.scales = s


@torch.no_grad()
def fold_dual(model: nn.Module, scales: tuple[float, float]) -> int:
    """Replace every DualLoRALinear by its base layer with the adapters folded in at ``scales``:
    ``W += s_r * c_r * B_r A_r + s_f * c_f * B_f A_f`` (transposed for GPT-2's Conv1D), in place.
    The model is then an adapter-free policy with the function of ``adapter_scales(model, scales)``
    (to float rounding). Returns the number of layers folded."""
    from prorl_bench.models.lora import is_transposed

    s_r, s_f = scales
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, DualLoRALinear):
                continue
            delta = (child.retain_scaling * s_r) * (child.lora_retain_B.float() @ child.lora_retain_A.float())
            delta = delta + (child.forget_scaling * s_f) * (child.lora_forget_B.float() @ child.lora_forget_A.float())
            base = child.base
            if is_transposed(base):
                delta = delta.t()
            base.weight.add_(delta.to(base.weight.dtype))
            setattr(parent, name, base)
            n += 1
    return n


@contextlib.contextmanager
def route_rows(model: nn.Module, mask: torch.Tensor) -> Iterator[None]:
    """Detach the retain path for rows where ``mask`` (bool, shape (batch,)) is True."""
    layers = dual_layers(model)
    for m in layers:
        m.row_mask = mask.to(torch.bool)
    try:
        yield
    finally:
        for m in layers:
            m.row_mask = None


def check_growth(model: nn.Module) -> None:
    """Rank growth is defined for plain LoRA only: fail loudly on dual adapters."""
    if dual_layers(model):
        raise ValueError("growth=rank is not supported with adapter=dual_lora; use growth=none")

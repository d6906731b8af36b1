"""Dual (retain / forget) LoRA adapters for gradient routing (docs/routing.md).

``DualLoRALinear`` wraps an ``nn.Linear``:
    y = base(x) + s_r * c_r * (x A_r^T B_r^T) + s_f * c_f * (x A_f^T B_f^T)
with c = alpha / rank fixed at attach time and (s_r, s_f) the inference scales set by
``adapter_scales`` (``both`` = (1, 1), ``retain_only`` = (1, 0), ``forget_only`` = (0, 1), or any
pair; ``fold_dual`` folds them into the base weights for export).

Routing is a single pass with a per-sample stop-gradient: inside ``route_rows(model, mask)``
(mask: bool, shape (batch,), True = labelled hack sample) the retain parameters get exactly zero
gradient from labelled rows, as if their retain path used detached parameters; forward values are
unchanged, and the forget adapter (and the retain adapter on unlabelled rows) learn as usual.
Both adapters run as one product of rank r_r + r_f with a hand-written backward
(``_DualAdapterFn``), which applies that stop-gradient by masking rows of the retain columns.
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
        """x: (batch, ..., fan_in) -> (batch, ..., fan_out). Both adapters in one fused product
        (``_DualAdapterFn``); an adapter at scale 0 is left out, so its parameters get no gradient."""
        s_r, s_f = self.scales
        out = self.base(x)
        a, b, scales = [], [], []
        if s_r != 0.0:
            a, b, scales = [self.lora_retain_A], [self.lora_retain_B], [self.retain_scaling * s_r]
        if s_f != 0.0:
            a, b, scales = [*a, self.lora_forget_A], [*b, self.lora_forget_B], [*scales, self.forget_scaling * s_f]
        if not a:
            return out
        keep, n_routed = self._keep_rows(x) if s_r != 0.0 else (None, 0)
        if not torch.is_grad_enabled():  # no graph to record: the forward product alone
            return _adapter_forward(x, out, torch.cat(a) if len(a) > 1 else a[0], _scaled_b(b, scales))[0]
        return _DualAdapterFn.apply(x, out, keep, n_routed, tuple(scales), len(a), *a, *b)

    def _keep_rows(self, x: torch.Tensor) -> tuple[torch.Tensor | None, int]:
        """Routing: ``(~row_mask, retain rank)``, the rows whose retain gradient is kept and the
        number of leading rank columns (the retain adapter's) it applies to; ``(None, 0)`` without."""
        if self.row_mask is None:
            return None, 0
        if self.row_mask.shape[0] != x.shape[0]:
            raise ValueError(f"route mask has {self.row_mask.shape[0]} rows, batch has {x.shape[0]}")
        return ~self.row_mask, self.lora_retain_A.shape[0]


def _scaled_b(bs: list[torch.Tensor], scales: list[float]) -> torch.Tensor:
    """(fan_out, sum of ranks): the B matrices side by side, each times its adapter's scale
    (alpha / rank * inference scale), so one matmul applies every adapter at its scale."""
    if len(bs) == 1:
        return bs[0] * scales[0]
    return torch.cat([b * s for b, s in zip(bs, scales)], dim=1)


def _adapter_forward(
    x: torch.Tensor, base_out: torch.Tensor, a: torch.Tensor, b_scaled: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``base_out + (x A^T) B_s^T`` and ``h = x A^T``. x: (..., fan_in), base_out: (..., fan_out),
    a: (R, fan_in), b_scaled: (fan_out, R); h: (N, R) with N the product of x's leading dims."""
    h = x.reshape(-1, x.shape[-1]) @ a.t()
    out = torch.addmm(base_out.reshape(-1, base_out.shape[-1]), h, b_scaled.t())  # one kernel: product + add
    return out.view(base_out.shape), h


def _zero_routed(t: torch.Tensor, keep: torch.Tensor | None, n_routed: int) -> torch.Tensor:
    """Zero, in place, the first ``n_routed`` columns (the retain adapter's rank) of the rows whose
    sample is labelled. t: (N, R) with N = batch * rows per sample; keep: (batch,) bool."""
    if keep is not None and n_routed and t.numel():
        t.view(keep.shape[0], -1, t.shape[-1])[..., :n_routed].mul_(keep.view(-1, 1, 1))
    return t


class _DualAdapterFn(torch.autograd.Function):
    """``base_out + (x A^T) B_s^T`` for the active adapters, their A stacked along the rank
    (A: (R, fan_in)) and their B side by side times their scales (B_s: (fan_out, R)), with the
    backward written by hand: a few kernels per layer instead of autograd's graph of small ops (the
    dual path cost 3-4x a plain step on the tiny models, where the number of ops is the cost).

    Routing (``keep``: (batch,) bool, False = labelled sample): the first ``n_routed`` rank columns
    (the retain adapter) get their A and B gradients from kept rows only. x's gradient flows through
    every row and adapter, as with detached retain parameters: the stop-gradient is on the
    parameters, so earlier layers still learn through this layer's retain path.
    Inputs after ``n_adapters``: the adapters' A matrices, then their B matrices, in the same order.
    """

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, base_out, keep, n_routed, scales, n_adapters, *ab):
        a = torch.cat(ab[:n_adapters]) if n_adapters > 1 else ab[0]
        b_scaled = _scaled_b(list(ab[n_adapters:]), list(scales))
        out, h = _adapter_forward(x, base_out, a, b_scaled)
        # B's gradient reads h on kept rows only (routed columns): mask it once, here
        ctx.save_for_backward(x, a, b_scaled, _zero_routed(h, keep, n_routed), keep)
        ctx.n_routed, ctx.scales = n_routed, scales
        ctx.ranks = [t.shape[0] for t in ab[:n_adapters]]
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, g):
        x, a, b_scaled, h_routed, keep = ctx.saved_tensors
        need, n = ctx.needs_input_grad, len(ctx.ranks)
        g2 = g.reshape(-1, g.shape[-1])  # (N, fan_out)
        gh = g2 @ b_scaled  # (N, R): gradient of h = x A^T, scales included
        grad_x = (gh @ a).view(x.shape) if need[0] else None  # every row, every adapter
        grads_a: list[torch.Tensor | None] = [None] * n
        grads_b: list[torch.Tensor | None] = [None] * n
        if any(need[6 : 6 + n]):  # gh is not needed unmasked any more: mask in place
            grads_a = list((_zero_routed(gh, keep, ctx.n_routed).t() @ x.reshape(-1, x.shape[-1])).split(ctx.ranks))
        if any(need[6 + n :]):  # (fan_out, R) w.r.t. B_s, then each adapter's block times its scale
            grad_b = g2.t() @ h_routed
            grads_b = [t * s for t, s in zip(grad_b.split(ctx.ranks, dim=1), ctx.scales)]
        # autograd casts each gradient to its input's dtype (bf16 under CUDA autocast -> fp32 params)
        return grad_x, g, None, None, None, None, *grads_a, *grads_b


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

"""The optimizer and the update-size metric, chosen by device (``algo.adamw_impl``, ``hardware.update_norm``).

AdamW implementation (``adamw_impl``):

* ``fused`` on CUDA: one kernel for the whole step (TRL's ``adamw_torch_fused``); the multi-tensor
  ``foreach`` step it replaces held 204 ms of device time over 4 RL steps against 94 ms for TRL's
  fused one at 0.48B parameters (docs/performance.md).
* ``foreach`` on CPU: torch 2.13's CPU fused AdamW exists but rounds differently (measured: parameters
  differ by up to 3e-8 absolute after 5 steps; tests/rl/test_optim.py checks agreement to rounding), so
  ``auto`` keeps foreach there and every CPU trajectory stays bit-identical to earlier releases.

A resumed run keeps the implementation its checkpoint was made with (``Optimizer.load_state_dict``
restores the saved group flags): a same-device resume is unaffected.

``update_norm`` (the L2 norm of one RL step's parameter change, all minibatches together) needs the
weights from before the update: no cheaper exact form exists (the norm of a sum of per-minibatch
updates is not a function of their norms). Where that copy lives (``hardware.update_norm``):

* ``device``: a clone on the weights' device (CPU runs: the copy costs host RAM only);
* ``host``: a copy in (pinned, reused) host memory, enqueued asynchronously on the same stream before
  the update writes the weights; after the update it comes back one piece at a time, so the GPU holds
  one piece instead of a full copy (1.9 GiB at 0.5B parameters);
* ``off``: no copy, ``update_norm`` is NaN.

The norm streams every tensor in flat pieces of at most ``NORM_CHUNK`` elements: each piece's
difference is written straight into a reused fp64 buffer (the fp32 subtraction, then the exact
widening), squared in place and summed; the pieces' fp64 sums are added in order on the host. The
transient memory is one fp64 buffer of ``NORM_CHUNK`` elements plus (``host``) one fp32 piece of the
snapshot: 6 MiB, whatever the tensor sizes. The whole-tensor form it replaces held an fp32 copy, an
fp64 copy and its fp64 square of each tensor at once: 2.7 GB for the 151,936 x 896 embedding of a
0.5B model (measured on an H200: 20 MiB for one 1024 x 1024 weight). ``host`` and ``device`` run the
same pieces through the same operations: their metrics are bit-identical. A tensor of at most
``NORM_CHUNK`` elements is one piece, so its sum is the whole-tensor form's, bit for bit.

``auto`` = ``device`` on CPU and ``host`` on CUDA (GPU memory is the scarce one there).
"""

from __future__ import annotations

import torch

from prorl_bench.config import AdamWImpl, UpdateNormMode


def adamw_impl(want: AdamWImpl | str, device: torch.device) -> AdamWImpl:
    """``algo.adamw_impl`` resolved for parameters on ``device``."""
    want = AdamWImpl(want)
    if want == AdamWImpl.auto:
        return AdamWImpl.fused if device.type == "cuda" else AdamWImpl.foreach
    return want


def build_adamw(params: list[torch.nn.Parameter], a) -> torch.optim.AdamW:
    """AdamW over ``params`` with the hyper-parameters of ``a`` (AlgoConfig) and its implementation."""
    device = params[0].device if params else torch.device("cpu")
    impl = adamw_impl(getattr(a, "adamw_impl", AdamWImpl.auto), device)
    flags = {"fused": True} if impl == AdamWImpl.fused else {"foreach": True}
    return torch.optim.AdamW(
        params, lr=a.lr, betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_eps, weight_decay=a.weight_decay, **flags
    )


def update_norm_mode(want: UpdateNormMode | str, device: torch.device) -> UpdateNormMode:
    want = UpdateNormMode(want)
    if want == UpdateNormMode.auto:
        return UpdateNormMode.host if device.type == "cuda" else UpdateNormMode.device
    return want


_HOST: dict[tuple, list[torch.Tensor]] = {}  # host snapshot buffers, reused while the shapes stay


class ParamSnapshot:
    """The trainable weights before an update (see the module docstring for ``mode``)."""

    def __init__(self, params: list[torch.Tensor], mode: UpdateNormMode | str) -> None:
        device = params[0].device if params else torch.device("cpu")
        self.mode = update_norm_mode(mode, device)
        self.copies: list[torch.Tensor] = []
        if self.mode == UpdateNormMode.device:
            self.copies = [p.detach().clone(memory_format=torch.contiguous_format) for p in params]
        elif self.mode == UpdateNormMode.host:
            self.copies = _host_buffers(params)
            for buf, p in zip(self.copies, params):
                buf.copy_(p.detach(), non_blocking=True)  # stream-ordered before the optimizer's writes

    def norm(self, params: list[torch.Tensor], chunk: int | None = None) -> float:
        """L2 norm of ``params`` minus the snapshot, from fp64 sums over pieces of at most ``chunk``
        elements (default ``NORM_CHUNK``; see the module docstring), one host transfer for all of
        them; NaN when the mode is ``off``."""
        if self.mode == UpdateNormMode.off:
            return float("nan")
        if not params:
            return 0.0
        chunk = NORM_CHUNK if chunk is None else chunk
        if chunk < 1:
            raise ValueError(f"chunk: at least 1 element, got {chunk}")
        device = params[0].device
        work = torch.empty(min(chunk, max(p.numel() for p in params)), dtype=torch.float64, device=device)
        sums = [_squared_diff(a, b, work) for p, b in zip(params, self.copies) for a, b in _pieces(p, b, chunk)]
        return sum(torch.stack(sums).tolist()) ** 0.5


NORM_CHUNK = 2**19  # elements per piece of the norm: a 4 MiB fp64 buffer + a 2 MiB fp32 piece of the snapshot


def _pieces(p: torch.Tensor, b: torch.Tensor, chunk: int):
    """The same flat pieces (views, at most ``chunk`` elements) of a weight ``p`` and its snapshot ``b``.
    A non-contiguous weight (none in the bench's models) is flattened first: one copy of that tensor."""
    flat_p, flat_b = p.detach().reshape(-1), b.reshape(-1)
    for i in range(0, flat_p.numel(), chunk):
        yield flat_p[i : i + chunk], flat_b[i : i + chunk]


def _squared_diff(p: torch.Tensor, b: torch.Tensor, work: torch.Tensor) -> torch.Tensor:
    """sum((p - b)^2) in fp64 on ``p``'s device, as a 0-dim tensor. ``p - b`` is rounded in ``p``'s
    dtype and widened exactly (as ``(p - b).double()``), written into ``work`` (no other temporary on
    CUDA); ``b`` may live on the host (pinned: the copy is asynchronous, ordered on the stream)."""
    if b.device != p.device:
        b = b.to(p.device, non_blocking=True)
    d = work[: p.numel()]
    torch.sub(p, b, out=d)
    return d.square_().sum()


def _host_buffers(params: list[torch.Tensor]) -> list[torch.Tensor]:
    key = tuple((tuple(p.shape), p.dtype, p.device.type) for p in params)
    if key not in _HOST:
        _HOST.clear()  # one set of buffers: a new shape (LoRA growth) replaces the old set
        pin = any(p.device.type == "cuda" for p in params)
        _HOST[key] = [torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin) for p in params]
    return _HOST[key]

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
  the update writes the weights; after the update each tensor comes back one at a time, so the GPU
  holds one extra tensor at most instead of a full copy (1.8 GiB at 0.48B parameters). The per-tensor
  sums are the same operations on the same values as ``device``: the metric is bit-identical;
* ``off``: no copy, ``update_norm`` is NaN.

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
            self.copies = [p.detach().clone() for p in params]
        elif self.mode == UpdateNormMode.host:
            self.copies = _host_buffers(params)
            for buf, p in zip(self.copies, params):
                buf.copy_(p.detach(), non_blocking=True)  # stream-ordered before the optimizer's writes

    def norm(self, params: list[torch.Tensor]) -> float:
        """L2 norm of ``params`` minus the snapshot: one host transfer for all tensors (the per-tensor
        sums, in fp64, added in order on the host); NaN when the mode is ``off``."""
        if self.mode == UpdateNormMode.off:
            return float("nan")
        if not params:
            return 0.0
        sums = []
        for b, p in zip(self.copies, params):
            before = b.to(p.device, non_blocking=True) if b.device != p.device else b
            sums.append((p.detach() - before).double().square().sum())
        return sum(torch.stack(sums).tolist()) ** 0.5


def _host_buffers(params: list[torch.Tensor]) -> list[torch.Tensor]:
    key = tuple((tuple(p.shape), p.dtype, p.device.type) for p in params)
    if key not in _HOST:
        _HOST.clear()  # one set of buffers: a new shape (LoRA growth) replaces the old set
        pin = any(p.device.type == "cuda" for p in params)
        _HOST[key] = [torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin) for p in params]
    return _HOST[key]

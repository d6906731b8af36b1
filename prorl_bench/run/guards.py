"""Non-finite guards: a NaN or inf in a loss, gradient or parameter fails the run (or warns), naming
the step, stage and tensor. Signals and sweep stops live in ``prorl_bench.run.signals``."""

from __future__ import annotations

import warnings

import torch

from prorl_bench.config import NonFinitePolicy
from prorl_bench.errors import NonFiniteError  # noqa: F401  (re-exported: the guards raise it too)


class NonFiniteGuard:
    """``ok(t, ...)`` is True for finite tensors. Otherwise: raise (``fail``, the default) or warn,
    count and return False so the caller skips the minibatch/update (``skip_batch``).

    On CUDA in ``fail`` mode the checks are deferred: flags stay on the device and ``flush()`` (once
    per step) raises for the first non-finite tensor, so the update loop has no host<->device sync.
    ``skip_batch`` must decide before ``optimizer.step()`` and therefore always checks at once.
    """

    def __init__(self, policy: NonFinitePolicy, device: torch.device | None = None) -> None:
        self.policy = policy
        self.skipped = 0
        self.defer = policy == NonFinitePolicy.fail and device is not None and device.type == "cuda"
        self._pending: list[tuple[torch.Tensor, str]] = []

    @staticmethod
    def _message(step: int, stage: str, name: str) -> str:
        return f"non-finite values in '{name}' at step {step}, stage '{stage}'"

    def ok(self, t: torch.Tensor, step: int, stage: str, name: str) -> bool:
        if self.defer:
            self._pending.append((torch.isfinite(t.detach()).all(), self._message(step, stage, name)))
            return True
        if bool(torch.isfinite(t).all()):
            return True
        msg = self._message(step, stage, name)
        if self.policy == NonFinitePolicy.fail:
            raise NonFiniteError(msg)
        self.skipped += 1
        warnings.warn(f"{msg}: skipped (guard.nonfinite=skip_batch, {self.skipped} so far)", stacklevel=2)
        return False

    def params_ok(self, params: list[torch.Tensor], step: int) -> None:
        """After ``optimizer.step()``: every parameter finite, or the run stops (in either policy —
        a finite loss and gradient can still step into inf/NaN weights, e.g. with a huge lr, and
        there is no batch left to skip: every later forward and sample would be NaN)."""
        flag = torch.stack([torch.isfinite(p.detach()).all() for p in params]).all()
        msg = self._message(step, "update", "parameters after the optimizer step") + " (lower algo.lr?)"
        if self.defer:
            self._pending.append((flag, msg))
        elif not bool(flag):
            raise NonFiniteError(msg)

    def flush(self) -> None:
        """Raise for the first deferred non-finite tensor (one device->host transfer)."""
        pending, self._pending = self._pending, []
        if pending:
            flags = torch.stack([f for f, _ in pending]).tolist()
            for good, (_, msg) in zip(flags, pending):
                if not good:
                    raise NonFiniteError(msg)

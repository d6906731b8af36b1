"""Run-level guards: non-finite values and preemption signals."""

from __future__ import annotations

import signal
import warnings
from types import FrameType

import torch

from prorl_bench.config import NonFinitePolicy


class NonFiniteError(FloatingPointError):
    """A NaN/inf appeared; the message names the step, stage and tensor."""


class Preempted(RuntimeError):
    """A preemption signal arrived; a checkpoint was written at the end of ``step``."""

    def __init__(self, step: int, signum: int) -> None:
        super().__init__(f"preempted by {signal.Signals(signum).name} after step {step}; checkpoint written")
        self.step = step
        self.signum = signum


class NonFiniteGuard:
    """``ok(t, ...)`` is True for finite tensors. Otherwise: raise (``fail``, the default) or warn,
    count and return False so the caller skips the minibatch/update (``skip_batch``)."""

    def __init__(self, policy: NonFinitePolicy) -> None:
        self.policy = policy
        self.skipped = 0

    def ok(self, t: torch.Tensor, step: int, stage: str, name: str) -> bool:
        if bool(torch.isfinite(t).all()):
            return True
        msg = f"non-finite values in '{name}' at step {step}, stage '{stage}'"
        if self.policy == NonFinitePolicy.fail:
            raise NonFiniteError(msg)
        self.skipped += 1
        warnings.warn(f"{msg}: skipped (guard.nonfinite=skip_batch, {self.skipped} so far)", stacklevel=2)
        return False


class PreemptionFlag:
    """Turns SIGTERM / SIGUSR1 (SLURM preemption) into a flag the trainer checks at step ends.

    Handlers are only installed in the main thread, and restored by ``close()``.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        for s in self.SIGNALS:
            try:
                self._previous[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def close(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

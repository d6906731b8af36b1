"""Run-level guards: non-finite values and preemption signals."""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from types import FrameType

import torch

from prorl_bench.config import NonFinitePolicy
from prorl_bench.errors import NonFiniteError  # noqa: F401  (re-exported: the guards raise it too)


class Preempted(RuntimeError):
    """A preemption signal arrived: at the end of ``step`` (a checkpoint was written), or before
    training began (``stage``: "warm-up" or "setup"; nothing to checkpoint)."""

    def __init__(self, step: int, signum: int, stage: str | None = None) -> None:
        name = signal.Signals(signum).name
        if stage is None:
            msg = f"preempted by {name} after step {step}; checkpoint written"
        else:
            msg = f"preempted by {name} during the {stage}, before step 1; nothing to checkpoint"
        super().__init__(msg)
        self.step, self.signum, self.stage = step, signum, stage

    def __reduce__(self):
        # joblib/loky send a job's exception to the parent by pickling it; the default reduce passes
        # only the message to __init__, which takes more arguments — the parent then got
        # BrokenProcessPool and the rest of the sweep died with it.
        return (type(self), (self.step, self.signum, self.stage))


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


STOP_FILE = "STOP"  # in a sweep directory: the sweep was told to stop (see stop_sweep_on_signals)
# (pid, STOP path) of the process that runs the multirun: a launcher that runs jobs in that process
# (Hydra's basic launcher, joblib with n_jobs=1) must still let a signal stop the whole sweep
_SWEEP_MAIN: tuple[int, Path] | None = None


def _stop_sweep(signum: int) -> bool:
    """In the multirun's own process: write the STOP file (the sweep ends); False elsewhere."""
    if _SWEEP_MAIN is None or _SWEEP_MAIN[0] != os.getpid():
        return False
    write_stop_file(_SWEEP_MAIN[1], signum)
    return True


def write_stop_file(stop: Path, signum: int) -> None:
    """Stop a sweep: write its STOP file (the signal's name) and say so, once; a no-op when it exists."""
    if not stop.exists():
        stop.parent.mkdir(parents=True, exist_ok=True)
        stop.write_text(f"{signal.Signals(signum).name}\n")
        print(
            f"prorl-bench: {signal.Signals(signum).name} received: stopping the sweep (running jobs "
            "checkpoint at their next step end; no new job starts)",
            file=sys.stderr,
            flush=True,
        )


class SweepStopped(RuntimeError):
    """A job of a stopped sweep was not started (nothing was trained; re-run the sweep to run it)."""

    def __reduce__(self):
        return (type(self), self.args)


class PreemptionFlag:
    """Turns SIGTERM / SIGUSR1 (SLURM preemption) and SIGINT (Ctrl-C) into a flag the trainer checks
    at step ends; a sweep's ``STOP`` file (``stop_file``) raises the same flag. A second SIGINT
    aborts at once (KeyboardInterrupt), as a user pressing Ctrl-C twice expects.

    Handlers are only installed in the main thread, and restored by ``close()``.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

    def __init__(self, stop_file: Path | None = None) -> None:
        self.signum: int | None = None
        self.stop_file = stop_file
        self._previous: dict[int, object] = {}
        for s in self.SIGNALS:
            try:
                self._previous[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        _stop_sweep(signum)  # a job in the sweep's own process: the signal stops the sweep too
        if self.signum is None:
            self.signum = signum
            print(
                f"prorl-bench: {signal.Signals(signum).name} received: stopping at the next step end "
                "(with a checkpoint once training has begun)"
                + (" (Ctrl-C again to abort now)" if signum == signal.SIGINT else ""),
                file=sys.stderr,
                flush=True,
            )

    def stop_signal(self) -> int | None:
        """The signal that asked to stop (a STOP file counts as SIGTERM), or None."""
        return self.signum if self.requested else None

    @property
    def requested(self) -> bool:
        if self.signum is None and self.stop_file is not None and self.stop_file.exists():
            self.signum = signal.SIGTERM  # the sweep was stopped: same as being preempted
        return self.signum is not None

    def close(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()


def stop_sweep_on_signals(sweep_dir: Path) -> None:
    """In a multirun's main process: SIGTERM / SIGINT write ``sweep_dir/STOP`` instead of killing it.

    Running jobs see the file at their next step end and stop as preempted (with a checkpoint);
    jobs that have not started see it and do not start; the multirun then ends by itself, so the
    launcher shuts its worker processes down (nothing is orphaned) and the table is still written.
    A STOP file from an earlier, stopped attempt is removed: re-running resumes.
    """
    global _SWEEP_MAIN
    stop = Path(sweep_dir) / STOP_FILE
    stop.unlink(missing_ok=True)
    _SWEEP_MAIN = (os.getpid(), stop)

    def handle(signum: int, frame: FrameType | None) -> None:
        _stop_sweep(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        try:
            signal.signal(s, handle)
        except ValueError:  # not the main thread
            pass


def ignore_stop_signals_between_jobs() -> None:
    """In a sweep worker: SIGTERM / SIGINT outside a job are left to the sweep's STOP file.

    A signal to the whole process group reaches the workers too; an idle worker that died of it
    would break the process pool (and with it the checkpoints of the jobs still running). In the
    multirun's own process (jobs run in-process) the sweep's handler stays: a signal stops the sweep."""
    if threading.current_thread() is not threading.main_thread():
        return
    if _SWEEP_MAIN is not None and _SWEEP_MAIN[0] == os.getpid():
        return
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)

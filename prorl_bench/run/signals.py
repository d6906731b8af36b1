"""Signals and sweep stops: SIGTERM / SIGUSR1 / SIGINT become a flag the trainer checks at step ends
(``PreemptionFlag``), a sweep's ``STOP`` file stops every job of it, and the exceptions that say so.

Torch-free on purpose: the sweep wrapper (``prorl-bench-sweep``) imports it, and a process that only
watches a sweep should not pay for importing torch.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType


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

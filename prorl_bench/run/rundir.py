"""One process per run directory: an exclusive, non-blocking lock held for the whole run.

Two processes on one directory would race on the same files (observed without a lock: a
``completed, 40 steps`` summary over 5 metrics rows; a directory whose config says seed 1 holding
seed-0 results). The second process fails at once, naming the holder. ``fcntl.flock`` locks are
released by the kernel when the holder dies, so a killed run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path
from types import TracebackType

from prorl_bench.config import ConfigError
from prorl_bench.run.outputs import METRICS, SUMMARY

LOCK_FILE = ".lock"


class RunDirBusy(ConfigError):
    """Another process holds the run directory (nothing was written)."""


def has_previous_run(run_dir: Path) -> bool:
    """True when ``run_dir`` already holds (part of) a run: its record must not be overwritten by a
    process that refuses to start."""
    d = Path(run_dir)
    return (d / SUMMARY).exists() or (d / METRICS).exists() or (d / "checkpoints").exists()


class RunDirLock:
    """``with RunDirLock(run_dir):`` — exclusive ownership of ``run_dir`` (raises RunDirBusy)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> RunDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirBusy(
                f"run directory {self.path.parent} is in use by {holder}; wait for it to finish, "
                "or give this run another run_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%F %T')}".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

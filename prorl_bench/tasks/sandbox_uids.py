"""Sample uids that never repeat: across the threads of a process, across processes and across runs.

Kernel keyrings, ``RLIMIT_NPROC`` and file ownership are per uid, not per namespace, so two samples must
never share one. Each process reserves blocks of ``BLOCK`` uids from a counter file in a shared state
directory, under an exclusive ``flock`` (the counter only grows), and hands its block out one uid per sample.
The directory is ``$PRORL_BENCH_SANDBOX_STATE`` or ``/run/prorl-bench`` (a tmpfs: it starts again at a
reboot, when every keyring and process of the old uids is gone too).
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

BLOCK = 1024  # uids per reservation
UID_MAX = 2**31 - 2  # the largest uid handed out (the kernel's (uid_t)-1 is "no change")


class UidError(RuntimeError):
    """The uid counter cannot be used (unwritable state directory, corrupt counter, exhausted range)."""


def state_dir() -> Path:
    return Path(os.environ.get("PRORL_BENCH_SANDBOX_STATE", "/run/prorl-bench"))


def reserve_block(first: int) -> range:
    """Reserve the next ``BLOCK`` uids at or above ``first`` for this process (a file lock; no reuse)."""
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = d / "sandbox_uids"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        try:
            nxt = int(text) if text else first
        except ValueError:
            raise UidError(f"{path}: corrupt uid counter {text!r}; delete it when no sandbox runs") from None
        start = max(nxt, first)
        if start + BLOCK - 1 > UID_MAX:
            raise UidError(f"{path}: the sandbox uid range is exhausted; delete it after a reboot")
        data = f"{start + BLOCK}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        os.fsync(fd)
        return range(start, start + BLOCK)
    except OSError as e:
        raise UidError(f"sandbox uid counter {path}: {e}") from e
    finally:
        os.close(fd)


class UidPool:
    """One uid per call of ``take``, from blocks this process reserved; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: list[range] = []
        self._left: list[int] = []
        self._pid = os.getpid()

    def take(self, first: int) -> int:
        with self._lock:
            if self._pid != os.getpid():  # a forked copy of the pool: its block belongs to the parent
                self._pid, self._left = os.getpid(), []
            if not self._left or self._left[-1] < first:
                block = reserve_block(first)
                self._blocks.append(block)
                self._left = list(reversed(block))
            return self._left.pop()

    def reserved(self) -> list[range]:
        """Every block this process reserved (the uids its samples ran as)."""
        with self._lock:
            return list(self._blocks)


UIDS = UidPool()

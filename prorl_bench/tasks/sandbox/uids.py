"""Sample uids that never repeat: across the threads of a process, across processes and across runs.

Kernel keyrings, ``RLIMIT_NPROC`` and file ownership are per uid, not per namespace, so two samples must
never share one. Each process reserves blocks of ``BLOCK`` uids from **one machine-wide counter** and hands
its block out one uid per sample:

- The counter lives in ``DEFAULT_STATE`` (``/run/prorl-bench/sandbox_uids``; a tmpfs: it starts again at a
  reboot, when every keyring and process of the old uids is gone too). ``$PRORL_BENCH_SANDBOX_STATE`` may
  point a run at another directory (e.g. where ``/run`` is not writable), but two counters on one machine
  would hand out the same uids: every process that uses a counter holds a shared lock on its entry in
  ``DEFAULT_STATE/counters/``, and a process is refused (``UidError``) while another holds a different one.
  If ``DEFAULT_STATE`` cannot be written at all, a run pointed elsewhere is warned and goes on.
- The counter only grows, under an exclusive ``flock`` of ``sandbox_uids.lock``; it is written atomically
  (a temporary file, ``fsync``, ``rename``, ``fsync`` of the directory): a crash leaves the old value or the
  new one, never an empty file. An empty or corrupt counter is an error, never a restart from the bottom.
- Before a block is handed out, no process (any of its real, effective, saved or filesystem uids: every
  ``/proc/<pid>/status``) and no kernel key owner (``/proc/key-users``) may hold a uid of it; a block that
  is in use is skipped (with a warning) and the counter moves past it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import sys
import threading
from pathlib import Path

from prorl_bench.tasks.sandbox.errors import SandboxBroken

BLOCK = 1024  # uids per reservation
UID_MAX = 2**31 - 2  # the largest uid handed out (the kernel's (uid_t)-1 is "no change")
DEFAULT_STATE = Path("/run/prorl-bench")  # the machine-wide counter's directory
ENV = "PRORL_BENCH_SANDBOX_STATE"
COUNTER, LOCK, REGISTRY = "sandbox_uids", "sandbox_uids.lock", "counters"
MAX_SKIPS = 64  # blocks in use skipped before giving up


class UidError(SandboxBroken):
    """The uid counter cannot be used (unwritable or second counter, corrupt counter, exhausted range)."""


def state_dir() -> Path:
    return Path(os.environ.get(ENV) or DEFAULT_STATE)


def read_counter(path: Path) -> int | None:
    """The counter's value; None if the file does not exist (a fresh machine); UidError if it is empty or
    not a number (never read as "start again": that would hand out every uid again)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    text = raw.decode("ascii", "replace").strip()
    if not text.isdigit():
        why = "it must hold the next free uid (the highest one any sandbox used + 1)"
        raise UidError(f"{path}: empty or corrupt sandbox uid counter {raw[:40]!r}; {why}: restore it, or delete "
                       "it after a reboot")  # fmt: skip
    return int(text)


def write_counter(d: Path, value: int) -> None:
    """``d/COUNTER`` = value, atomically: a temporary file, fsync, rename over the counter, fsync of ``d``."""
    tmp = d / f".{COUNTER}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        data = f"{value}\n".encode()
        if os.write(fd, data) != len(data):
            raise OSError(errno.EIO, f"short write to {tmp}")
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.rename(tmp, d / COUNTER)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def uids_in_use(lo: int, hi: int) -> set[int]:
    """The uids in [lo, hi) that a live process (any of its four uids) or a kernel key owner holds."""
    found: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                line = next((x for x in f if x.startswith(b"Uid:")), b"")
        except OSError:
            continue  # exited meanwhile
        found |= {u for u in map(int, line.split()[1:]) if lo <= u < hi}
    try:
        with open("/proc/key-users") as f:
            found |= {u for u in (int(x.split(":")[0]) for x in f if x.strip()) if lo <= u < hi}
    except OSError:
        pass  # no keyrings in this kernel
    return found


def reserve_block(first: int) -> range:
    """Reserve the next ``BLOCK`` uids at or above ``first`` for this process (a file lock; no reuse; no
    uid of the block held by a process or a key)."""
    d = state_dir()
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(d / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise UidError(f"sandbox uid counter {d}: {e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        nxt = read_counter(d / COUNTER)
        start = first if nxt is None else max(nxt, first)
        for _ in range(MAX_SKIPS):
            if start + BLOCK - 1 > UID_MAX:
                raise UidError(f"{d / COUNTER}: the sandbox uid range is exhausted; delete it after a reboot")
            busy = uids_in_use(start, start + BLOCK)
            if not busy:
                break
            print(f"[prorl-bench] sandbox uids {start}..{start + BLOCK - 1} skipped: in use by a process or a "
                  f"key ({sorted(busy)[:5]})", file=sys.stderr)  # fmt: skip
            start += BLOCK
        else:
            raise UidError(f"{d / COUNTER}: {MAX_SKIPS} blocks of sandbox uids in a row are in use")
        write_counter(d, start + BLOCK)
        return range(start, start + BLOCK)
    except OSError as e:
        raise UidError(f"sandbox uid counter {d / COUNTER}: {e}") from e
    finally:
        os.close(fd)


def _entry(d: Path) -> str:
    return hashlib.sha256(str(d.resolve()).encode()).hexdigest()[:24]


def claim_counter(d: Path) -> int | None:
    """Hold (for this process's life: the returned descriptor) a shared lock on ``d``'s entry in the
    registry of counters in use; UidError if another process holds a different counter. None (with a
    warning) if the registry cannot be written and ``d`` is not the default."""
    reg = DEFAULT_STATE / REGISTRY
    try:
        reg.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(reg / _entry(d), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        if d.resolve() == DEFAULT_STATE.resolve():
            raise UidError(f"sandbox uid counter {d}: {e}") from e
        print(f"[prorl-bench] WARNING: sandbox uid counter {d} cannot be registered in {reg} ({e.strerror}): a "
              "run using another counter on this machine could hand out the same uids", file=sys.stderr)  # fmt: skip
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.pwrite(fd, f"{d.resolve()}\n".encode(), 0)
    try:
        for other in sorted(reg.iterdir()):
            if other.name != _entry(d) and _held(other):
                held = other.read_text().strip() or other.name
                raise UidError(f"sandbox uid counter {d} refused: another run on this machine uses the counter "
                               f"in {held}, and two counters hand out the same uids (unset {ENV}, or point it "
                               "at that directory)")  # fmt: skip
    except BaseException:
        os.close(fd)
        raise
    return fd


def _held(path: Path) -> bool:
    """Whether a process holds a lock on ``path`` (a counter in use)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the probe's own lock
    return False


class UidPool:
    """One uid per call of ``take``, from blocks this process reserved; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: list[range] = []
        self._left: list[int] = []
        self._pid = os.getpid()
        self._claimed: dict[Path, int | None] = {}

    def take(self, first: int) -> int:
        with self._lock:
            if self._pid != os.getpid():  # a forked copy of the pool: its block belongs to the parent
                self._pid, self._left, self._claimed = os.getpid(), [], {}
            if not self._left or self._left[-1] < first:
                d = state_dir()
                if d not in self._claimed:
                    self._claimed[d] = claim_counter(d)
                block = reserve_block(first)
                self._blocks.append(block)
                self._left = list(reversed(block))
            return self._left.pop()

    def reserved(self) -> list[range]:
        """Every block this process reserved (the uids its samples ran as)."""
        with self._lock:
            return list(self._blocks)


UIDS = UidPool()

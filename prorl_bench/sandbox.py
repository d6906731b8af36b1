"""Sandboxed execution of untrusted Python programs (one process per program, resource-limited).

Each program runs in a fresh ``python -I`` subprocess with: a wall-clock timeout (seconds), an
RLIMIT_CPU limit (seconds), RLIMIT_AS (bytes), RLIMIT_FSIZE (bytes), RLIMIT_NPROC, a throw-away
working directory, a scrubbed environment, its own session (process group), and -- when the
kernel allows it -- its own empty network namespace (``unshare --net``). The whole process group
is SIGKILLed at the end of every sample, whatever happened.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

FAIL_CLASSES = ("ok", "syntax_error", "exception", "wrong_answer", "timeout", "memory", "killed", "no_code")

# Runner executed inside the child: applies limits, then runs the program and reports via exit code.
_RUNNER = r"""
import os, resource, sys
cpu, mem, fsize, nproc, uid = (int(a) for a in sys.argv[2:7])
if uid >= 0 and os.getuid() == 0:
    # Unprivileged user: cannot signal the (root) parent, write root-owned files, or exceed NPROC.
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
try:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
except (ValueError, OSError):
    pass
src = open(sys.argv[1]).read()
try:
    code = compile(src, "<program>", "exec")
except (SyntaxError, ValueError):
    sys.stdout.flush(); import os; os._exit(91)
try:
    exec(code, {"__name__": "__main__"})
except MemoryError:
    import os; os._exit(93)
except RecursionError:
    print("RecursionError", file=sys.stderr); sys.stderr.flush(); os._exit(92)
except SystemExit:
    raise
except BaseException:
    import traceback; traceback.print_exc(limit=3); sys.stderr.flush(); os._exit(92)
"""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits: ``wall_s``/``cpu_s`` in seconds, ``memory_bytes``/``fsize_bytes`` in bytes."""

    wall_s: float = 5.0
    cpu_s: int = 5
    memory_bytes: int = 512 * 2**20
    fsize_bytes: int = 1 * 2**20
    nproc: int = 64
    # When running as root, each program gets its own unprivileged uid from [uid, uid + 4096) so
    # RLIMIT_NPROC (counted per uid) is per sample: a fork bomb cannot starve its neighbours. -1: keep.
    uid: int = 200000
    max_output_bytes: int = 1 * 2**20


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one program: ``status`` in ok|syntax_error|exception|timeout|memory|killed."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float


@lru_cache(maxsize=1)
def isolation_level() -> str:
    """'netns+pidns' if ``unshare --net --pid`` works here (no network, parent invisible), else 'rlimits'."""
    exe = shutil.which("unshare")
    if exe is None:
        return "rlimits"
    try:
        r = subprocess.run([exe, "--net", "--pid", "--fork", "--", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "rlimits"
    return "netns+pidns" if r.returncode == 0 else "rlimits"


@lru_cache(maxsize=8)
def interpreter(uid: int) -> str:
    """A Python whose stdlib the sandbox user can import (the venv's may live under unreadable /root)."""
    if uid < 0 or os.getuid() != 0:
        return sys.executable
    for exe in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            r = subprocess.run([exe, "-I", "-S", "-c", "import subprocess, traceback, socket"], user=uid,
                               group=uid, extra_groups=[], capture_output=True, timeout=30, cwd="/")
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return exe
    raise RuntimeError(f"sandbox: no Python interpreter importable by uid {uid}; set SandboxLimits(uid=-1)")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_UIDS = itertools.count()
_UID_LOCK = threading.Lock()


def _next_uid(base: int) -> int:
    with _UID_LOCK:
        return base + next(_UIDS) % 4096


def run_program(source: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run ``source`` as a Python program in the sandbox; never raises for program misbehaviour."""
    drop = limits.uid >= 0 and os.getuid() == 0
    uid = _next_uid(limits.uid) if drop else -1
    work = tempfile.mkdtemp(prefix="prorl_sbx_")
    try:
        prog = os.path.join(work, "prog.py")
        runner = os.path.join(work, "_runner.py")
        with open(prog, "w") as f:
            f.write(source)
        with open(runner, "w") as f:
            f.write(_RUNNER)
        lim = (limits.cpu_s, limits.memory_bytes, limits.fsize_bytes, limits.nproc, uid)
        cmd = [interpreter(limits.uid if drop else -1), "-I", "-S", runner, prog, *map(str, lim)]
        if drop:
            os.chown(work, uid, uid)
            os.chmod(runner, 0o644)
            os.chmod(prog, 0o644)
        if isolation_level() == "netns+pidns":
            # New net + pid namespaces: no network, and the program cannot see or signal the parent.
            cmd = [shutil.which("unshare") or "unshare", "--net", "--pid", "--fork", "--kill-child", "--", *cmd]
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        timed_out = False
        try:
            out, err = proc.communicate(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            out, err = proc.communicate()
        finally:
            _kill_group(proc.pid)  # descendants that escaped into the group die too
        wall = time.monotonic() - t0
        rc = proc.returncode
        out_s = out[: limits.max_output_bytes].decode("utf-8", "replace")
        err_s = err[-4096:].decode("utf-8", "replace")
        # the signal that ended the program: a negative return code, or — behind `unshare --fork`,
        # which exits with 128 + the child's signal — a code above 128
        wrapped = cmd[0].endswith("unshare")
        sig = -rc if rc is not None and rc < 0 else (rc - 128 if wrapped and rc is not None and rc > 128 else None)
        if timed_out or sig == signal.SIGXCPU:
            status = "timeout"
        elif rc == 0:
            status = "ok"
        elif rc == 91:
            status = "syntax_error"
        elif rc == 93 or "MemoryError" in err_s:
            status = "memory"
        elif sig is not None:
            status = "killed"
        else:
            status = "exception"
        return SandboxResult(status, rc, out_s, err_s, wall)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_many(sources: list[str], limits: SandboxLimits = SandboxLimits(), workers: int = 16) -> list[SandboxResult]:
    """Run programs concurrently (threads driving subprocesses); results in input order."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
        return list(ex.map(lambda s: run_program(s, limits), sources))

"""Sandboxed execution of untrusted Python programs, with a result channel the program cannot forge.

One sample = one trusted runner process (``sandbox_runner.py``, started as ``python -I -S -c``) that never
runs the program itself: for each test call it forks a fresh child that drops to the sample's unprivileged
uid, applies the limits, executes the program and calls the entry point on that call's arguments; the return
value comes back to the runner over a pipe made for that call, and the runner forwards one frame per call to
this process over a pipe no child holds. The expected values never leave this process. The program's stdout
and stderr are only output: read here with a hard byte cap while it runs.

Isolation levels (``isolation()``, probed once by running a real sample):

- ``full`` (root and util-linux ``unshare``): new mount, pid, network, IPC and UTS namespaces. The runner
  builds the sample's root: a read-only tmpfs holding read-only, nosuid binds of ``/usr`` (and the merged-/usr
  links), the interpreter's own prefix (its stdlib) and ``/etc/ld.so.cache``; fresh tmpfs ``/tmp`` and
  ``/dev/shm`` (``tmpfs_bytes`` each); ``/dev/{null,zero,random,urandom}``; a fresh ``/proc`` of the
  sample's pid namespace; then moves the root there. No project file, data file, home or host ``/tmp`` is
  reachable, no network, no host process visible; everything the sample wrote dies with its namespaces.
- ``netns+pidns``: no network, own pid namespace, but the host filesystem is visible (read-only where the
  sample's uid lacks permission, which is not the case for world-readable project files).
- ``rlimits``: only the limits, the uid (as root) and the process-group kill.

Every level: RLIMIT_CPU (``cpu_s``), RLIMIT_AS (``memory_bytes``), RLIMIT_FSIZE, RLIMIT_NPROC, no core
dumps, no new privileges, a scrubbed environment, stdin from /dev/null; the wall limit ``wall_s`` is enforced
by the runner per call and here with ``WALL_MARGIN_S`` on top; when ``run_program`` returns, no process of
the sample is alive (pid namespace: its PID 1 exits only after the kernel has reaped every other process).
"""

from __future__ import annotations

import itertools
import json
import marshal
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

FAIL_CLASSES = (
    "ok", "syntax_error", "exception", "wrong_answer", "timeout", "memory", "killed", "output_limit", "no_code",
)  # fmt: skip
LEVELS = ("full", "netns+pidns", "rlimits")
WALL_MARGIN_S = 0.5  # the harness kills a sample this long after its wall limit if the runner has not ended it
RUNNER_FAILED = 90  # exit code of a runner that could not set the sample up (a harness error, raised loudly)
_RUNNER = (Path(__file__).resolve().parent / "sandbox_runner.py").read_text()
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_NAMESPACES = {
    "full": ("--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child"),
    "netns+pidns": ("--net", "--pid", "--fork", "--kill-child"),
}


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): e.g. its filesystem could not be built."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits: ``wall_s``/``cpu_s`` in seconds, the ``*_bytes`` in bytes."""

    wall_s: float = 5.0
    cpu_s: int = 5
    memory_bytes: int = 512 * 2**20
    fsize_bytes: int = 1 * 2**20
    nproc: int = 64
    # When running as root, each program gets its own unprivileged uid from [uid, uid + 4096) so
    # RLIMIT_NPROC (counted per uid) is per sample: a fork bomb cannot starve its neighbours. -1: keep.
    uid: int = 200000
    max_output_bytes: int = 1 * 2**20  # stdout, and separately stderr: past it the sample is killed
    max_result_bytes: int = 1 * 2**20  # one call's JSON-encoded return value
    tmpfs_bytes: int = 8 * 2**20  # the private /tmp and /dev/shm (level full), each


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sample.

    ``status``: ok | syntax_error | exception | timeout | memory | killed | output_limit. ``calls``: per
    requested call, ``{"value": v}`` (the JSON-decoded return value), ``{"error": name}`` (it raised), or
    None (no result: the program exited, crashed or ran out of time first, or the call never ran).
    ``stdout`` (at most ``max_output_bytes``) and ``stderr`` (its last 4 KiB) are the program's output."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    calls: tuple = field(default=(), repr=False)


@dataclass(frozen=True)
class Isolation:
    """The isolation in force here: ``level`` (one of LEVELS) and why a stronger one is unavailable."""

    level: str
    reason: str = ""

    def exposed(self) -> str:
        """What a program can reach at this level that it cannot under ``full``."""
        if self.level == "full":
            return "nothing beyond the limits (see docs/code_task.md)"
        what = ("every world-readable file of this machine (the project, its problem files with the expected "
                "answers, other users' files), world-writable directories such as /tmp and /dev/shm, "
                "Unix sockets under them")  # fmt: skip
        if self.level == "rlimits":
            what += ", the network, and the host's processes (a process that leaves its group may outlive the sample)"
        return what


def _bound_trees() -> list[str]:
    trees = [p for p in _SYSTEM if os.path.isdir(p) and not os.path.islink(p)]
    for p in {sys.base_prefix, sys.base_exec_prefix}:
        trees += [p, os.path.realpath(p)]
    return sorted(set(trees))


def _inside_any(path: str, trees: Sequence[str]) -> bool:
    return any(path.startswith(t.rstrip("/") + "/") for t in trees)


def default_hidden() -> list[str]:
    """Paths that must stay invisible even if they lie inside a bound tree (a package installed under /usr)."""
    package = Path(__file__).resolve().parents[1]  # prorl_bench/, and its checkout or site-packages above it
    return [str(package), str(package.parent), os.getcwd(), os.path.expanduser("~")]


def _job(source: str, calls: Sequence[list] | None, entry_point: str, limits: SandboxLimits, mode: str,
         workdir: str, uid: int, hide: Sequence[str]) -> dict[str, Any]:  # fmt: skip
    trees = _bound_trees()
    hidden = sorted({os.path.realpath(p) for p in hide} | set(hide))
    return {
        "source": source, "calls": None if calls is None else [list(c) for c in calls], "entry_point": entry_point,
        "mode": mode, "workdir": workdir, "uid": uid, "wall_s": limits.wall_s, "cpu_s": limits.cpu_s,
        "memory_bytes": limits.memory_bytes, "fsize_bytes": limits.fsize_bytes, "nproc": limits.nproc,
        "max_result_bytes": limits.max_result_bytes, "tmpfs_bytes": limits.tmpfs_bytes,
        "system": [p for p in _SYSTEM if os.path.lexists(p)],
        "binds": [*trees, "/etc/ld.so.cache"],
        "hide": [p for p in hidden if _inside_any(p, trees) and not any(_inside_any(t, [p]) or t == p for t in trees)],
    }  # fmt: skip


@lru_cache(maxsize=8)
def interpreter(uid: int) -> str:
    """A Python whose stdlib the sandbox user can import without a private root (the venv's may live under an
    unreadable /root); level ``full`` binds the interpreter's prefix into the sample's root instead."""
    if uid < 0 or os.getuid() != 0:
        return sys.executable
    for exe in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            probe = "import _json, ctypes, marshal, resource, select, traceback"  # what the runner needs
            r = subprocess.run([exe, "-I", "-S", "-c", probe], user=uid, group=uid, extra_groups=[],
                               capture_output=True, timeout=30, cwd="/")  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return exe
    raise SandboxError(f"sandbox: no Python interpreter importable by uid {uid}; set SandboxLimits(uid=-1)")


_UIDS = itertools.count()
_UID_LOCK = threading.Lock()


def _next_uid(base: int) -> int:
    with _UID_LOCK:
        return base + next(_UIDS) % 4096


def _descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, parents first (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(k) for k in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _kill_sample(proc: subprocess.Popen, wrapped: bool) -> None:
    """SIGKILL the sample. Behind ``unshare --fork`` the runner (PID 1 of the namespace) is killed, not
    ``unshare``: ``unshare`` reaps it only after the kernel has killed and reaped the whole namespace."""
    for pid in _descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if not wrapped:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass


@dataclass
class _Streams:
    """What the sample wrote, read with caps while it runs."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    frames: bytearray = field(default_factory=bytearray)
    stderr_bytes: int = 0
    overflow: bool = False


def _pump(proc: subprocess.Popen, result_fd: int, limits: SandboxLimits, n_calls: int, deadline: float,
          wrapped: bool) -> tuple[_Streams, bool]:  # fmt: skip
    """Read stdout, stderr and the frames until all close; kill at the output cap or the deadline."""
    s = _Streams()
    frame_cap = (n_calls + 1) * (limits.max_result_bytes + 4096)  # the runner's own bound on what it sends
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    sel.register(result_fd, selectors.EVENT_READ, "frames")
    killed_at: float | None = None
    timed_out = False
    while sel.get_map():
        now = time.monotonic()
        if killed_at is None and now >= deadline:
            timed_out, killed_at = True, now
        if killed_at is not None and proc.poll() is None:
            _kill_sample(proc, wrapped)  # again each pass: a runner not yet forked by `unshare` at the first
        if killed_at is not None and now - killed_at > 2.0 and proc.poll() is not None:
            break  # level rlimits: a process that left the group still holds a pipe; stop listening
        wait = 0.05 if killed_at is not None else max(deadline - now, 0.0)
        for key, _ in sel.select(timeout=wait):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            if key.data == "stdout":
                if len(s.stdout) <= limits.max_output_bytes:  # past the cap: drained, not kept
                    s.stdout += chunk
                s.overflow |= len(s.stdout) > limits.max_output_bytes
            elif key.data == "stderr":
                s.stderr_bytes += len(chunk)
                s.stderr = (s.stderr + chunk)[-4096:]
                s.overflow |= s.stderr_bytes > limits.max_output_bytes
            else:
                s.frames += chunk
                if len(s.frames) > frame_cap:
                    raise SandboxError(f"sandbox runner sent more than {frame_cap} bytes of results")
            if s.overflow and killed_at is None:
                killed_at = time.monotonic()
                _kill_sample(proc, wrapped)
    sel.close()
    del s.stdout[limits.max_output_bytes :]
    return s, timed_out


def _parse_frames(data: bytes) -> list[tuple[dict, bytes]]:
    frames, pos = [], 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:
            break  # a frame cut by a kill
        try:
            header = json.loads(data[pos:end])
        except ValueError:
            raise SandboxError(f"sandbox runner sent a malformed frame: {bytes(data[pos:end])[:200]!r}") from None
        payload = data[end + 1 : end + 1 + header["n"]]
        if len(payload) < header["n"]:
            break
        frames.append((header, payload))
        pos = end + 1 + header["n"]
    return frames


def _call_result(payload: bytes) -> dict | None:
    """The child's JSON, parsed here (untrusted: malformed, too deep or a huge int is just no result)."""
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if isinstance(value, dict) and len(value) == 1 and ("value" in value or isinstance(value.get("error"), str)):
        return value
    return None


def _status(frames: list[tuple[dict, bytes]], streams: _Streams, timed_out: bool) -> str:
    if streams.overflow or any(h["kind"] == "too_large" for h, _ in frames):
        return "output_limit"
    if timed_out or any(h["kind"] == "timeout" for h, _ in frames):
        return "timeout"
    for h, _ in frames:
        if h["kind"] in ("import", "main", "died"):
            if "signal" in h:
                return "killed"
            code = h["code"]
            if h["kind"] in ("import", "main") and code == 91:
                return "syntax_error"
            if h["kind"] in ("import", "main") and code == 93:
                return "memory"
            if code != 0 or h["kind"] != "main":
                return "exception"
    return "ok"


def run_program(
    source: str,
    limits: SandboxLimits = SandboxLimits(),
    calls: Sequence[list] | None = None,
    entry_point: str = "",
    hide: Sequence[str] | None = None,
    level: str | None = None,
) -> SandboxResult:
    """Run ``source`` in the sandbox: as a program (``calls`` None), or once per argument list in ``calls``
    calling ``entry_point``. Never raises for program misbehaviour; raises SandboxError if the sandbox fails."""
    level = level or isolation().level
    drop = limits.uid >= 0 and os.getuid() == 0
    uid = _next_uid(limits.uid) if drop else -1
    work = tempfile.mkdtemp(prefix="prorl_sbx_")
    job_fd = os.memfd_create("prorl_sbx_job")
    rfd, wfd = os.pipe()
    try:
        if drop and level != "full":
            os.chown(work, uid, uid)
        mode = "full" if level == "full" else ("pidns" if level == "netns+pidns" else "rlimits")
        job = _job(source, calls, entry_point, limits, mode, work, uid, default_hidden() if hide is None else hide)
        os.write(job_fd, marshal.dumps(job))
        os.lseek(job_fd, 0, os.SEEK_SET)
        exe = sys.executable if level == "full" else interpreter(limits.uid if drop else -1)
        cmd = [exe, "-I", "-S", "-c", _RUNNER, str(job_fd), str(wfd)]
        if level in _NAMESPACES:
            cmd = [shutil.which("unshare") or "unshare", *_NAMESPACES[level], "--", *cmd]
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp" if level == "full" else work, "LANG": "C.UTF-8",
               "TMPDIR": "/tmp" if level == "full" else work}  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, pass_fds=(job_fd, wfd))  # fmt: skip
        os.close(wfd)
        wfd = -1
        try:
            streams, timed_out = _pump(proc, rfd, limits, len(calls or [None]), t0 + limits.wall_s + WALL_MARGIN_S,
                                       wrapped=level in _NAMESPACES)  # fmt: skip
        except BaseException:
            _kill_sample(proc, level in _NAMESPACES)  # an error here: the sample must not outlive it
            raise
        finally:
            proc.stdout.close()
            proc.stderr.close()
            rc = proc.wait()
            if level not in _NAMESPACES:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # descendants that stayed in the group
                except OSError:
                    pass
        wall = time.monotonic() - t0
        frames = _parse_frames(bytes(streams.frames))
        killed_by_us = timed_out or streams.overflow
        if rc != 0 and not killed_by_us:
            tail = bytes(streams.stderr).decode("utf-8", "replace")
            raise SandboxError(f"sandbox runner failed (exit {rc}, isolation {level}): {tail[-2000:]}")
        results: list[dict | None] = [None] * len(calls or [])
        for h, payload in frames:
            if h["kind"] == "result" and calls is not None and 0 <= h["i"] < len(results):
                results[h["i"]] = _call_result(payload)
        return SandboxResult(
            _status(frames, streams, timed_out), rc, bytes(streams.stdout).decode("utf-8", "replace"),
            bytes(streams.stderr).decode("utf-8", "replace"), wall, tuple(results),
        )  # fmt: skip
    finally:
        for fd in (job_fd, rfd, wfd):
            if fd >= 0:
                os.close(fd)
        shutil.rmtree(work, ignore_errors=True)


def run_many(
    sources: list[str],
    limits: SandboxLimits = SandboxLimits(),
    workers: int = 16,
    calls: Sequence[Sequence[list]] | None = None,
    entry_points: Sequence[str] | None = None,
    hide: Sequence[str] | None = None,
) -> list[SandboxResult]:
    """Run programs concurrently (threads driving sandboxes); results in input order. ``calls[k]`` and
    ``entry_points[k]``: the calls of program k (default: run each as a plain program)."""

    def one(k: int) -> SandboxResult:
        if calls is None:
            return run_program(sources[k], limits, hide=hide)
        return run_program(sources[k], limits, calls[k], entry_points[k], hide=hide)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
        return list(ex.map(one, range(len(sources))))


_PROBE = "import os\ndef probe(x):\n    return [x, os.getuid() != 0, sorted(os.listdir('/tmp'))]\n"


@lru_cache(maxsize=1)
def isolation() -> Isolation:
    """The strongest level that works here, found by running a real one-call sample at each level."""
    reasons = []
    for level in LEVELS[:-1]:
        if shutil.which("unshare") is None:
            reasons.append("util-linux `unshare` not found")
            break
        if level == "full" and os.getuid() != 0:
            reasons.append("full: needs root (mount namespaces and a private root)")
            continue
        try:
            r = run_program(_PROBE, SandboxLimits(wall_s=30.0, cpu_s=10), [[7]], "probe", level=level)
        except (SandboxError, OSError) as e:
            reasons.append(f"{level}: {str(e).strip()[-300:]}")
            continue
        want = [7, os.getuid() == 0, []] if level == "full" else None
        got = r.calls[0]["value"] if r.calls and r.calls[0] and "value" in r.calls[0] else None
        if r.status == "ok" and (want is None and got and got[0] == 7 or got == want):
            return Isolation(level, "; ".join(reasons))
        reasons.append(f"{level}: probe sample gave {r.status} {r.calls} {r.stderr[-300:]!r}")
    return Isolation("rlimits", "; ".join(reasons))


def isolation_level() -> str:
    """'full', 'netns+pidns' or 'rlimits' (see the module docstring)."""
    return isolation().level

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

Layers beside the namespaces (each probed; ``Isolation.missing`` names the ones this machine cannot give):

- ``cgroup`` (``sandbox_cgroup.py``): a cgroup per sample bounds its memory (``memory_bytes``, including
  shared memory, ``memfd`` and tmpfs pages; no swap), its process count (``nproc``) and its CPU weight (one
  equal share per sample, whatever it forks or ``setsid()``s). ``memory`` failures are read from its OOM counter.
- ``seccomp`` (``sandbox_seccomp.py``): no new namespaces, keyrings, exotic socket families, ptrace, bpf, ...
- ``uids`` (``sandbox_uids.py``): as root, each sample runs as a uid never used before on this machine
  (one machine-wide counter, written atomically under a file lock; blocks held by a live process or a key
  skipped), so keyrings and RLIMIT_NPROC are never shared across samples or runs.

Classes come from what the supervising side observed (its clocks, the cgroup's memory and CPU counters, the
exit status of the server, which the runner owns), never from a message or a signal the program can send
itself. The runner's and this process's work per sample is bounded whatever the program writes (a fixed
number of control messages, paced reads of every stream). A failure of the sandbox itself raises
``SandboxBroken`` (naming what broke): a run stops rather than train on zeros.

Every level: RLIMIT_CPU (``cpu_s``, per process), RLIMIT_NOFILE (``nofile``), RLIMIT_FSIZE, RLIMIT_NPROC,
RLIMIT_AS (``memory_bytes``, only without a memory cgroup), no core dumps, no new privileges, a scrubbed
environment, stdin from /dev/null. The program's top level runs once per sample (``import_wall_s``); each
call runs in a fresh fork of that state (``wall_s`` each, timed by the runner); when ``run_program``
returns, no process of the sample is alive and its cgroup is gone.
"""

from __future__ import annotations

import fcntl
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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from prorl_bench.tasks.sandbox_cgroup import CgroupLayout, SampleCgroup, find_layout
from prorl_bench.tasks.sandbox_errors import SandboxBroken, SandboxError
from prorl_bench.tasks.sandbox_seccomp import export_seccomp_bpf
from prorl_bench.tasks.sandbox_uids import UIDS

FAIL_CLASSES = (
    "ok", "syntax_error", "exception", "wrong_answer", "timeout", "memory", "crashed", "output_limit", "no_code",
    "scorer_error",
)  # fmt: skip
LEVELS = ("full", "netns+pidns", "rlimits")
WALL_MARGIN_S = 0.5  # the harness kills a sample this long after its wall limit if the runner has not ended it
RUNNER_FAILED = 90  # exit code of a runner that could not set the sample up (a harness error, raised loudly)
# The trainer's reads of a sample's stdout and stderr: after READ_BURST reads of a stream, at most one per
# READ_PACE_S (what is written meanwhile waits in the pipe; a writer that fills it blocks on its own time), so
# a program writing a byte at a time costs the trainer a bounded number of reads per second of its limits.
READ_BURST, READ_PACE_S = 64, 0.02
_HERE = Path(__file__).resolve().parent
_RUNNER = (_HERE / "sandbox_seccomp.py").read_text() + "\n" + (_HERE / "sandbox_runner.py").read_text()
# The runner's code, compiled once per process (compiling its ~600 lines costs ~6 ms CPU per sample) and
# read by each runner from a sealed memfd (argv[3], argv[4] bytes) with pread: no shared offset.
_BOOT = (
    "import marshal, os, sys\n"
    "exec(marshal.loads(os.pread(int(sys.argv[3]), int(sys.argv[4]), 0)), {'__name__': '__main__'})"
)
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_NAMESPACES = {
    "full": ("--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child"),
    "netns+pidns": ("--net", "--pid", "--fork", "--kill-child"),
}


@dataclass(frozen=True)
class SandboxLimits:
    """Per-sample limits: ``wall_s`` (each call; a plain program: its run), ``import_wall_s`` (the top level;
    None: ``wall_s``) and ``cpu_s`` (per process) in seconds, the ``*_bytes`` in bytes."""

    wall_s: float = 5.0
    cpu_s: int = 5
    memory_bytes: int = 512 * 2**20  # the sample's cgroup (all its processes together); else RLIMIT_AS
    fsize_bytes: int = 1 * 2**20
    nproc: int = 64  # the sample's cgroup pids.max, and RLIMIT_NPROC of its uid
    # When running as root, each sample gets its own unprivileged uid, never used before on this machine,
    # from a counter that starts at ``uid`` (sandbox_uids.py). -1: keep the caller's uid.
    uid: int = 200000
    import_wall_s: float | None = None
    nofile: int = 64  # RLIMIT_NOFILE
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
    missing: tuple = ()  # the layers this machine cannot give ("cgroup: why", "seccomp: why")

    def exposed(self) -> str:
        """What a program can reach at this level that it cannot under ``full`` with every layer."""
        gaps = []
        if any(m.startswith("cgroup") for m in self.missing):
            gaps.append("memory, processes and CPU bounded per process only (shared memory and memfd unbounded; "
                        "a sample can slow its neighbours)")  # fmt: skip
        if any(m.startswith("seccomp") for m in self.missing):
            gaps.append("new user namespaces (a full capability set inside one), kernel keyrings, AF_VSOCK and "
                        "other socket families, ptrace, bpf, io_uring")  # fmt: skip
        if self.level == "full":
            return "; ".join(gaps) or "nothing beyond the limits (see docs/code_task.md)"
        what = ("every world-readable file of this machine (the project, its problem files with the expected "
                "answers, other users' files), world-writable directories such as /tmp and /dev/shm, "
                "Unix sockets under them")  # fmt: skip
        if self.level == "rlimits":
            what += ", the network, and the host's processes (a process that leaves its group may outlive the sample)"
        return "; ".join([what, *gaps])


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
         workdir: str, uid: int, hide: Sequence[str], cgroup: SampleCgroup | None,
         seccomp: bytes) -> dict[str, Any]:  # fmt: skip
    trees = _bound_trees()
    hidden = sorted({os.path.realpath(p) for p in hide} | set(hide))
    import_wall = limits.wall_s if calls is None or limits.import_wall_s is None else limits.import_wall_s
    return {
        "source": source, "calls": None if calls is None else [list(c) for c in calls], "entry_point": entry_point,
        "mode": mode, "workdir": workdir, "uid": uid, "wall_s": limits.wall_s, "import_wall_s": import_wall,
        "cpu_s": limits.cpu_s, "rlimit_as": 0 if cgroup else limits.memory_bytes, "nofile": limits.nofile,
        "fsize_bytes": limits.fsize_bytes, "nproc": limits.nproc,
        "max_result_bytes": limits.max_result_bytes, "tmpfs_bytes": limits.tmpfs_bytes,
        "system": [p for p in _SYSTEM if os.path.lexists(p)],
        "binds": [*trees, "/etc/ld.so.cache"],
        "hide": [p for p in hidden if _inside_any(p, trees) and not any(_inside_any(t, [p]) or t == p for t in trees)],
        "cgroup": {"procs": cgroup.procs_files(), "counters": cgroup.counters(), "cpu": cgroup.cpu_counters()}
        if cgroup else None,
        "seccomp": seccomp,
    }  # fmt: skip


@lru_cache(maxsize=8)
def interpreter(uid: int) -> str:
    """A Python whose stdlib the sandbox user can import without a private root (the venv's may live under an
    unreadable /root); level ``full`` binds the interpreter's prefix into the sample's root instead."""
    if uid < 0 or os.getuid() != 0:
        return sys.executable
    for exe in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            probe = "import _json, _socket, ctypes, errno, marshal, resource, select, traceback"  # the runner's
            r = subprocess.run([exe, "-I", "-S", "-c", probe], user=uid, group=uid, extra_groups=[],
                               capture_output=True, timeout=30, cwd="/")  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return exe
    raise SandboxBroken(f"sandbox: no Python interpreter importable by uid {uid}; set SandboxLimits(uid=-1)")


_TAGS = itertools.count()
_TAG_LOCK = threading.Lock()


def _tag(uid: int) -> str:
    """A name for the sample's cgroup, unique in this process (the pid is added by SampleCgroup)."""
    if uid >= 0:
        return f"u{uid}"
    with _TAG_LOCK:
        return f"n{next(_TAGS)}"


@dataclass(frozen=True)
class Layers:
    """The layers beside the namespaces that this machine gives: a cgroup layout and a seccomp program
    (None / b"" when unavailable), and why each missing one is missing."""

    cgroup: CgroupLayout | None
    seccomp: bytes
    missing: tuple


_CODE_LOCK = threading.Lock()


def _runner_code() -> tuple[int, int]:
    """(fd, size) of a sealed memfd holding the marshalled runner (this interpreter's bytecode)."""
    with _CODE_LOCK:
        return _make_runner_code()


@lru_cache(maxsize=1)
def _make_runner_code() -> tuple[int, int]:
    data = marshal.dumps(compile(_RUNNER, "<sandbox_runner>", "exec"))
    fd = os.memfd_create("prorl_sbx_runner", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd, len(data)


_PROBE_LOCK = threading.Lock()  # the first callers of layers() / isolation() may be several threads at once
_ISOLATION_LOCK = threading.Lock()


def layers() -> Layers:
    """Probed once per process: a test group is made and removed; the filter is built."""
    with _PROBE_LOCK:
        return _layers()


@lru_cache(maxsize=1)
def _layers() -> Layers:
    missing = []
    layout, why = find_layout() if os.getuid() == 0 else (None, "needs root")
    if layout is not None:
        try:
            probe = SampleCgroup(layout, f"probe{threading.get_ident()}")
            probe.create(64 * 2**20, 8)
            probe.destroy()
        except OSError as e:
            layout, why = None, f"cannot make a group under {layout.dirs()}: {e}"
    if layout is None:
        missing.append(f"cgroup: {why}")
    try:
        bpf = export_seccomp_bpf()
    except OSError as e:
        bpf = b""
        missing.append(f"seccomp: {e} (Debian/Ubuntu: apt-get install libseccomp2)")
    return Layers(layout, bpf, tuple(missing))


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


class _Frames:
    """Frames from the runner, handled as they arrive and dropped: at most one frame is held at a time."""

    def __init__(self, on_frame: Callable[[dict, bytes], None], cap: int) -> None:
        self.on_frame, self.cap, self.buf = on_frame, cap, bytearray()

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        while True:
            end = self.buf.find(b"\n")
            if end < 0:
                if len(self.buf) > 4096:
                    raise SandboxBroken(f"sandbox runner sent a malformed frame: {bytes(self.buf[:200])!r}")
                return
            try:
                header = json.loads(self.buf[:end])
                n = int(header["n"])
            except (ValueError, KeyError, TypeError):
                raise SandboxBroken(f"sandbox runner sent a malformed frame: {bytes(self.buf[:200])!r}") from None
            if n > self.cap:
                raise SandboxBroken(f"sandbox runner sent a {n}-byte result (cap {self.cap})")
            if len(self.buf) < end + 1 + n:
                return  # the rest of this frame is still on its way (or cut by a kill: then never handled)
            payload = bytes(self.buf[end + 1 : end + 1 + n])
            del self.buf[: end + 1 + n]
            self.on_frame(header, payload)


@dataclass
class _Streams:
    """What the sample wrote, read with caps while it runs."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    overflow: bool = False
    reads: dict = field(default_factory=lambda: {"stdout": 0, "stderr": 0})

    def take(self, which: str, chunk: bytes, limits: SandboxLimits, keep_stdout: int) -> None:
        self.reads[which] += 1
        if which == "stdout":
            self.stdout_bytes += len(chunk)
            if len(self.stdout) < keep_stdout:  # past it: drained, not kept
                self.stdout += chunk[: keep_stdout - len(self.stdout)]
            self.overflow |= self.stdout_bytes > limits.max_output_bytes
        else:
            self.stderr_bytes += len(chunk)
            self.stderr = (self.stderr + chunk)[-4096:]
            self.overflow |= self.stderr_bytes > limits.max_output_bytes


def _pump(proc: subprocess.Popen, result_fd: int, limits: SandboxLimits, frames: _Frames, deadline: float,
          wrapped: bool, keep_stdout: int) -> tuple[_Streams, bool]:  # fmt: skip
    """Read stdout, stderr and the frames until all close; kill at the output cap or the deadline. Keeps the
    first ``keep_stdout`` bytes of stdout and the last 4 KiB of stderr; stdout and stderr are paced
    (READ_BURST, READ_PACE_S)."""
    s = _Streams()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    sel.register(result_fd, selectors.EVENT_READ, "frames")
    paused: dict = {}  # stream -> (name, when it is read again)
    killed_at: float | None = None
    timed_out = False
    try:
        while sel.get_map() or paused:
            now = time.monotonic()
            for f, (name, when) in list(paused.items()):
                if now >= when:
                    sel.register(f, selectors.EVENT_READ, name)
                    del paused[f]
            if killed_at is None and now >= deadline:
                timed_out, killed_at = True, now
            if killed_at is not None and proc.poll() is None:
                _kill_sample(proc, wrapped)  # again each pass: a runner not yet forked by `unshare` at the first
            if killed_at is not None and now - killed_at > 2.0 and proc.poll() is not None:
                break  # level rlimits: a process that left the group still holds a pipe; stop listening
            wait = 0.05 if killed_at is not None else max(deadline - now, 0.0)
            wait = min([wait, *(max(when - now, 0.0) for _, when in paused.values())])
            for key, _ in sel.select(timeout=wait):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.data == "frames":
                    frames.feed(chunk)
                else:
                    s.take(key.data, chunk, limits, keep_stdout)
                    if s.reads[key.data] > READ_BURST:
                        sel.unregister(key.fileobj)
                        paused[key.fileobj] = (key.data, time.monotonic() + READ_PACE_S)
                if s.overflow and killed_at is None:
                    killed_at = time.monotonic()
                    _kill_sample(proc, wrapped)
    finally:
        sel.close()
    return s, timed_out


def _error_name(payload: bytes) -> str | None:
    """The exception name of an ``{"error": name}`` payload (parsed only when short), else None."""
    if not payload.startswith(b'{"error": ') or len(payload) > 512:
        return None
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    return value["error"] if isinstance(value, dict) and isinstance(value.get("error"), str) else None


def _call_result(payload: bytes) -> dict | None:
    """The child's JSON, parsed here (untrusted: malformed, too deep or a huge int is just no result)."""
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if isinstance(value, dict) and len(value) == 1 and ("value" in value or isinstance(value.get("error"), str)):
        return value
    return None


_CPU_SIGNALS = (int(signal.SIGXCPU), int(signal.SIGKILL))  # what RLIMIT_CPU sends (soft, then hard limit)


def _status(headers: list[dict], streams: _Streams, timed_out: bool) -> str:
    """The sample's status from what the runner and this process observed: output caps, the cgroup's
    memory and CPU counters, the clocks, the exit status of a process the runner owns (its server) and the
    server's compile marker; never from a message or a signal the program can send itself."""
    if streams.overflow or any(h["kind"] == "too_large" for h in headers):
        return "output_limit"
    if any(h.get("oom") for h in headers):
        return "memory"
    if timed_out or any(h["kind"] == "timeout" for h in headers):
        return "timeout"
    for h in headers:
        kind = h["kind"]
        if kind == "protocol":
            return "exception"  # it wrote to the runner's control socket what the runner did not expect
        if kind == "died":  # a call ended with no result; its exit status is only the server's word
            return "timeout" if h.get("cpu") else ("crashed" if "signal" in h else "exception")
        if kind in ("import", "main"):
            if "signal" in h:  # the server's status, from the runner's own waitpid
                return "timeout" if h.get("cpu") and h["signal"] in _CPU_SIGNALS else "crashed"
            if not h.get("compiled", 1) and h["code"] == 91:
                return "syntax_error"
            if h["code"] != 0 or kind != "main":
                return "exception"
    return "ok"


def _harness_deadline(t0: float, limits: SandboxLimits, n_calls: int) -> float:
    """When this process kills a sample whose runner has not ended it: every phase's limit, the top level
    run again for each call (the weaker levels restart the server after each call), and a margin."""
    top = limits.wall_s if limits.import_wall_s is None else limits.import_wall_s
    return t0 + n_calls * (top + limits.wall_s) + top + WALL_MARGIN_S + 1.0


@dataclass
class _Sample:
    """One sample's resources on this side: made by ``_prepare``, released by ``close`` (in any case)."""

    uid: int
    cgroup: SampleCgroup | None
    work: str = ""
    fds: list = field(default_factory=list)

    def close(self) -> None:
        for fd in self.fds:
            if fd >= 0:
                os.close(fd)
        if self.work:
            shutil.rmtree(self.work, ignore_errors=True)
        if self.cgroup is not None:
            self.cgroup.destroy()


def _prepare(limits: SandboxLimits, level: str, lay: Layers) -> _Sample:
    """The sample's uid, cgroup and scratch directory. Any failure here is the sandbox's (SandboxBroken,
    naming what broke): the next sample would meet it too."""
    drop = limits.uid >= 0 and os.getuid() == 0
    uid = UIDS.take(limits.uid) if drop else -1  # UidError is a SandboxBroken
    cgroup = SampleCgroup(lay.cgroup, _tag(uid)) if lay.cgroup is not None else None
    sample = _Sample(uid, None)
    try:
        if cgroup is not None:
            try:
                cgroup.create(limits.memory_bytes, limits.nproc)
            except OSError as e:
                raise SandboxBroken(f"sandbox: cannot make the sample's cgroup {cgroup.name}: {e}") from e
            sample.cgroup = cgroup
        where = tempfile.gettempdir()
        try:
            sample.work = tempfile.mkdtemp(prefix="prorl_sbx_")
            if drop and level != "full":
                os.chown(sample.work, uid, uid)
        except OSError as e:
            raise SandboxBroken(f"sandbox: the scratch directory under {where} is unusable: {e}") from e
    except BaseException:
        sample.close()
        raise
    return sample


def _command(level: str, limits: SandboxLimits, sample: _Sample, job_fd: int, wfd: int) -> tuple[list, tuple]:
    """The runner's command line and the descriptors it inherits."""
    exe = sys.executable if level == "full" else interpreter(limits.uid if sample.uid >= 0 else -1)
    fds = (job_fd, wfd)
    if exe == sys.executable:  # the same interpreter: its bytecode, compiled once
        code_fd, size = _runner_code()
        cmd, fds = [exe, "-I", "-S", "-c", _BOOT, str(job_fd), str(wfd), str(code_fd), str(size)], (*fds, code_fd)
    else:
        cmd = [exe, "-I", "-S", "-c", _RUNNER, str(job_fd), str(wfd)]
    if level in _NAMESPACES:
        cmd = [shutil.which("unshare") or "unshare", *_NAMESPACES[level], "--", *cmd]
    return cmd, fds


class _Collector:
    """The frames of one sample: every header kept, each call's payload judged (``check``) or parsed as
    it arrives and dropped."""

    def __init__(self, calls: Sequence[list] | None, check: Callable[[int, bytes], bool] | None) -> None:
        self.calls, self.check = calls, check
        self.results: list[dict | None] = [None] * len(calls or [])
        self.headers: list[dict] = []

    def __call__(self, h: dict, payload: bytes) -> None:
        self.headers.append(h)
        i = h.get("i")
        if h["kind"] != "result" or self.calls is None or not isinstance(i, int) or not 0 <= i < len(self.results):
            return
        if h.get("oom"):
            return  # the sample hit its memory limit during this call: the call gets no credit
        name = _error_name(payload)
        if name is not None:
            self.results[i] = {"error": name}
        elif self.check is None:
            self.results[i] = _call_result(payload)
        else:
            self.results[i] = {"passed": bool(self.check(i, payload))}


def run_program(
    source: str,
    limits: SandboxLimits = SandboxLimits(),
    calls: Sequence[list] | None = None,
    entry_point: str = "",
    hide: Sequence[str] | None = None,
    level: str | None = None,
    check: Callable[[int, bytes], bool] | None = None,
    keep_stdout: int | None = None,
) -> SandboxResult:
    """Run ``source`` in the sandbox: as a program (``calls`` None), or calling ``entry_point`` once per
    argument list in ``calls``. ``check(i, payload)``, if given, judges call ``i``'s raw JSON as it arrives
    (the payload is then dropped: ``calls[i]`` is ``{"passed": bool}``). ``keep_stdout``: bytes of stdout
    kept (default ``max_output_bytes``). Never raises for program misbehaviour; raises SandboxBroken (naming
    what broke) if the sandbox cannot be set up or its runner fails."""
    level = level or isolation().level
    lay = layers()
    sample = _prepare(limits, level, lay)
    try:
        job_fd = os.memfd_create("prorl_sbx_job")
        sample.fds.append(job_fd)
        rfd, wfd = os.pipe()
        sample.fds += [rfd, wfd]
        mode = "full" if level == "full" else ("pidns" if level == "netns+pidns" else "rlimits")
        hidden = default_hidden() if hide is None else hide
        job = _job(source, calls, entry_point, limits, mode, sample.work, sample.uid, hidden, sample.cgroup,
                   lay.seccomp)  # fmt: skip
        os.write(job_fd, marshal.dumps(job))
        os.lseek(job_fd, 0, os.SEEK_SET)
        cmd, fds = _command(level, limits, sample, job_fd, wfd)
        tmp = "/tmp" if level == "full" else sample.work
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8", "TMPDIR": tmp}
        collect = _Collector(calls, check)
        keep = limits.max_output_bytes if keep_stdout is None else min(keep_stdout, limits.max_output_bytes)
        return _run(cmd, fds, env, sample, level, limits, collect, keep, len(calls or [None]))
    finally:
        sample.close()


def _run(cmd: list, fds: tuple, env: dict, sample: _Sample, level: str, limits: SandboxLimits,
         collect: _Collector, keep: int, n_calls: int) -> SandboxResult:  # fmt: skip
    """Start the runner, read what it and the sample write until they end, and class the outcome."""
    wfd = sample.fds.pop()  # the write end of the frames pipe: the runner's alone once it started
    frames = _Frames(collect, limits.max_result_bytes + 4096)
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, cwd=sample.work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, pass_fds=fds)  # fmt: skip
    finally:
        os.close(wfd)
    wrapped = level in _NAMESPACES
    try:
        streams, timed_out = _pump(proc, sample.fds[1], limits, frames, _harness_deadline(t0, limits, n_calls),
                                   wrapped, keep)  # fmt: skip
    except BaseException:
        _kill_sample(proc, wrapped)  # an error here: the sample must not outlive it
        raise
    finally:
        proc.stdout.close()
        proc.stderr.close()
        rc = proc.wait()
        if not wrapped:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # descendants that stayed in the group
            except OSError:
                pass
    wall = time.monotonic() - t0
    if rc != 0 and not (timed_out or streams.overflow):
        tail = bytes(streams.stderr).decode("utf-8", "replace")
        raise SandboxBroken(f"sandbox runner failed (exit {rc}, isolation {level}): {tail[-2000:]}")
    return SandboxResult(
        _status(collect.headers, streams, timed_out), rc, bytes(streams.stdout).decode("utf-8", "replace"),
        bytes(streams.stderr).decode("utf-8", "replace"), wall, tuple(collect.results),
    )  # fmt: skip


def run_many(
    sources: list[str],
    limits: SandboxLimits = SandboxLimits(),
    workers: int = 16,
    calls: Sequence[Sequence[list]] | None = None,
    entry_points: Sequence[str] | None = None,
    hide: Sequence[str] | None = None,
    checks: Sequence[Callable[[int, bytes], bool]] | None = None,
    on_result: Callable[[int, SandboxResult | BaseException], None] | None = None,
    keep_stdout: int | None = None,
) -> list[SandboxResult | None]:
    """Run programs concurrently (threads driving sandboxes). ``calls[k]`` and ``entry_points[k]``: the
    calls of program k (default: run each as a plain program); ``checks[k]``: its ``check``. Without
    ``on_result``: the results in input order (a sandbox error raises). With it: ``on_result(k, result or
    the exception)`` as each sample finishes (an error of one sample is that sample's), and a list of None.
    ``SandboxBroken`` always raises: the samples not yet started are cancelled (a broken sandbox would fail
    each of them), the running ones finish."""

    def one(k: int) -> SandboxResult | None:
        kw = {"hide": hide, "keep_stdout": keep_stdout}
        if calls is not None:
            kw.update(calls=calls[k], entry_point=entry_points[k], check=checks and checks[k])
        if on_result is None:
            return run_program(sources[k], limits, **kw)
        try:
            r = run_program(sources[k], limits, **kw)
        except SandboxBroken:
            raise
        except Exception as e:  # noqa: BLE001 (a failure of one sample is that sample's, reported to the caller)
            on_result(k, e)
        else:
            on_result(k, r)
        return None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
        futures = [ex.submit(one, k) for k in range(len(sources))]
        try:
            return [f.result() for f in futures]
        except BaseException:
            ex.shutdown(wait=True, cancel_futures=True)
            raise


_PROBE = "import os\ndef probe(x):\n    return [x, os.getuid() != 0, sorted(os.listdir('/tmp'))]\n"


def isolation() -> Isolation:
    """The strongest level that works here, found by running a real one-call sample at each level (with the
    layers this machine gives: ``Isolation.missing`` names the others). Probed once per process."""
    with _ISOLATION_LOCK:
        return _isolation()


@lru_cache(maxsize=1)
def _isolation() -> Isolation:
    missing = layers().missing
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
            return Isolation(level, "; ".join(reasons), missing)
        reasons.append(f"{level}: probe sample gave {r.status} {r.calls} {r.stderr[-300:]!r}")
    return Isolation("rlimits", "; ".join(reasons), missing)


def isolation_level() -> str:
    """'full', 'netns+pidns' or 'rlimits' (see the module docstring)."""
    return isolation().level

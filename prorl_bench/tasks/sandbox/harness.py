"""Sandboxed execution of untrusted Python programs, with a result channel the program cannot forge.

One sample = one trusted runner process (``runner.py``, started as ``python -I -S -c``) that never
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

- ``cgroup`` (``cgroup.py``): a cgroup per sample bounds its memory (``memory_bytes``, including
  shared memory, ``memfd`` and tmpfs pages; no swap), its process count (``nproc``) and its CPU weight (one
  equal share per sample, whatever it forks or ``setsid()``s). ``memory`` failures are read from its OOM counter.
- ``seccomp`` (``seccomp.py``): no new namespaces, keyrings, exotic socket families, ptrace, bpf, ...
- ``uids`` (``uids.py``): as root, each sample runs as a uid never used before on this machine
  (one machine-wide counter, written atomically under a file lock; blocks held by a live process or a key
  skipped), so keyrings and RLIMIT_NPROC are never shared across samples or runs.

Classes come from what the supervising side observed (its clocks, the cgroup's memory and CPU counters, the
exit status of the server, which the runner owns), never from a message or a signal the program can send
itself. The runner lives in the sample's cpu (and cpuacct) group, so its work for the sample is the sample's
CPU; its and this process's work per sample is bounded whatever the program writes (a fixed number of
control messages, paced reads of every stream). At level ``full`` the top level runs once: a server that a
call kills or stops ends the sample (``crashed``). A failure of the sandbox itself raises
``SandboxBroken`` (naming what broke): a run stops rather than train on zeros.

Every level: RLIMIT_CPU (``cpu_s``, per process), RLIMIT_NOFILE (``nofile``), RLIMIT_FSIZE, RLIMIT_NPROC,
RLIMIT_AS (``memory_bytes``, only without a memory cgroup), no core dumps, no new privileges, a scrubbed
environment, stdin from /dev/null. The program's top level runs once per sample (``import_wall_s``); each
call runs in a fresh fork of that state (``wall_s`` each, timed by the runner); when ``run_program``
returns, no process of the sample is alive and its cgroup is gone.
"""

from __future__ import annotations

import marshal
import os
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

from prorl_bench.tasks.sandbox.cgroup import SampleCgroup
from prorl_bench.tasks.sandbox.errors import SandboxBroken, SandboxError
from prorl_bench.tasks.sandbox.host import (
    _BOOT,
    _NAMESPACES,
    _RUNNER,
    Layers,
    _job,
    _runner_code,
    _tag,
    default_hidden,
    interpreter,
    layers,
)
from prorl_bench.tasks.sandbox.limits import LEVELS, Isolation, SandboxLimits, SandboxResult
from prorl_bench.tasks.sandbox.pump import (
    _call_result,
    _error_name,
    _Frames,
    _harness_deadline,
    _kill_sample,
    _pump,
    _status,
)
from prorl_bench.tasks.sandbox.uids import UIDS

DEFAULT_LIMITS = SandboxLimits()
_ISOLATION_LOCK = threading.Lock()


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
    limits: SandboxLimits = DEFAULT_LIMITS,
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
        deadline = _harness_deadline(t0, limits, n_calls, reruns=level != "full")
        streams, timed_out = _pump(proc, sample.fds[1], limits, frames, deadline, wrapped, keep)
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
    limits: SandboxLimits = DEFAULT_LIMITS,
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

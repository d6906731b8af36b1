"""What this machine gives the sandbox: the trees bound into a sample's root, an interpreter, the layers
(a cgroup layout and a seccomp program, probed once) and the runner's code (compiled once)."""

from __future__ import annotations

import fcntl
import itertools
import marshal
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from prorl_bench.tasks.sandbox.cgroup import CgroupLayout, SampleCgroup, find_layout
from prorl_bench.tasks.sandbox.errors import SandboxBroken
from prorl_bench.tasks.sandbox.limits import SandboxLimits
from prorl_bench.tasks.sandbox.seccomp import export_seccomp_bpf

_HERE = Path(__file__).resolve().parent
RUNNER_PARTS = ("seccomp.py", "runner_fs.py", "runner_procs.py", "runner.py")  # one text, in this order
_RUNNER = "\n".join((_HERE / name).read_text() for name in RUNNER_PARTS)
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
        "cgroup": {"procs": cgroup.procs_files(), "runner": cgroup.runner_files(), "counters": cgroup.counters(),
                   "cpu": cgroup.cpu_counters()} if cgroup else None,
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

"""A cgroup per sandbox sample: its memory (with shared memory, ``memfd`` and tmpfs pages), its process count
and its CPU weight bound the sample as a whole, not each of its processes.

cgroup v2 is used where this process's cgroup delegates the ``memory``, ``pids`` and ``cpu`` controllers to
its children; cgroup v1 otherwise (a hierarchy per controller). A sample's group is made beside nowhere
else: under this process's own group of each hierarchy, so whatever limits the machine puts on the trainer
also bound its samples. The group's name holds this process's pid and the sample's uid (unique: see
``uids.py``), so no lock is needed; groups left by a process that died are removed by the next one.

Its CPU time (v2 ``cpu.stat``, v1 ``cpuacct.usage``) is read by the runner around each phase: a process
that died of ``SIGXCPU``/``SIGKILL`` is classed ``timeout`` only when the group's CPU shows the limit was
reached (a program can send itself either signal).

The memory limit charges every page a process of the sample faults in (anonymous, page cache, shmem:
``memfd``, ``/dev/shm``, the private ``/tmp``) to the sample; at the limit the kernel's OOM killer kills a
process of that group only (a charge the kernel cannot satisfy otherwise fails with ENOMEM), and the
group's counters of both, read by the runner before and after each phase, are how a failure is classed
``memory`` (never the program's own words). Swap is limited to zero.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("memory", "pids", "cpu")  # cgroup v2 (its cpu.stat counts the group's CPU time)
V1_CONTROLLERS = (*CONTROLLERS, "cpuacct")  # cgroup v1: CPU time is counted by cpuacct
PREFIX = "prorl_sbx_"


@dataclass(frozen=True)
class CgroupLayout:
    """Where sample groups are made: ``version`` 1 or 2; ``parents`` maps each controller to a directory (v2:
    the same directory for all)."""

    version: int
    parents: dict

    def dirs(self) -> list[str]:
        return sorted(set(self.parents.values()))


def _mounts() -> list[tuple[str, str, set]]:
    """(mount point, fs type, super options) of every cgroup mount, from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _, opts = (right.split() + ["", "", ""])[:3]
            if fstype in ("cgroup", "cgroup2"):
                out.append((left.split()[4], fstype, set(opts.split(","))))
    return out


def _own_paths() -> dict:
    """controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


def _v2_layout(mounts, own) -> tuple[CgroupLayout | None, str]:
    v2 = [m for m, t, _ in mounts if t == "cgroup2"]
    if not v2 or "" not in own:
        return None, "no cgroup2 mount"
    d = v2[0] + own[""]
    try:
        enabled = set(Path(d, "cgroup.subtree_control").read_text().split())
        available = set(Path(d, "cgroup.controllers").read_text().split())
    except OSError as e:
        return None, f"cgroup2 {d}: {e.strerror}"
    if not set(CONTROLLERS) <= enabled:
        missing = sorted(set(CONTROLLERS) - available)
        why = f"controllers {missing} not available" if missing else "controllers not delegated to children"
        return None, f"cgroup2 {d}: {why} (cgroup.subtree_control: {sorted(enabled)})"
    if not os.access(d, os.W_OK):
        return None, f"cgroup2 {d}: not writable"
    return CgroupLayout(2, {c: d for c in CONTROLLERS}), ""


def _v1_layout(mounts, own) -> tuple[CgroupLayout | None, str]:
    parents = {}
    for c in V1_CONTROLLERS:
        points = [m for m, t, opts in mounts if t == "cgroup" and c in opts]
        if not points or c not in own:
            return None, f"cgroup v1: no {c} hierarchy"
        d = points[0] + own[c]
        if not os.access(d, os.W_OK):
            return None, f"cgroup v1: {d} not writable"
        parents[c] = d
    return CgroupLayout(1, parents), ""


def find_layout() -> tuple[CgroupLayout | None, str]:
    """The cgroup layout usable here, else (None, why not)."""
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError as e:
        return None, f"cgroups: {e}"
    layout, why2 = _v2_layout(mounts, own)
    if layout:
        return layout, ""
    layout, why1 = _v1_layout(mounts, own)
    if layout:
        _sweep(layout)
        return layout, ""
    return None, f"{why2}; {why1}"


def _sweep(layout: CgroupLayout) -> None:
    """Remove empty sample groups whose owning process is gone (a crashed run's)."""
    for parent in layout.dirs():
        try:
            names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
        except OSError:
            continue
        for n in names:
            owner = n[len(PREFIX) :].split("_")[0]
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                try:
                    os.rmdir(os.path.join(parent, n))
                except OSError:
                    pass


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class SampleCgroup:
    """The group of one sample: made by ``create``, joined by the sample's processes through the files of
    ``procs_files``, emptied and removed by ``destroy``."""

    def __init__(self, layout: CgroupLayout, tag: str) -> None:
        self.layout = layout
        self.name = f"{PREFIX}{os.getpid()}_{tag}"
        self.dirs = {c: os.path.join(p, self.name) for c, p in layout.parents.items()}

    def create(self, memory_bytes: int, pids: int) -> None:
        made = []
        try:
            for d in sorted(set(self.dirs.values())):
                os.mkdir(d, 0o755)
                made.append(d)
            if self.layout.version == 2:
                d = self.dirs["memory"]
                _write(f"{d}/memory.max", str(memory_bytes))
                _write(f"{d}/memory.swap.max", "0")
                _write(f"{d}/memory.oom.group", "1")  # an OOM kills the whole sample, not one process
                _write(f"{d}/pids.max", str(pids + 1))  # + the runner, which joins the group (one on v2)
                _write(f"{d}/cpu.weight", "100")
            else:
                m = self.dirs["memory"]
                _write(f"{m}/memory.limit_in_bytes", str(memory_bytes))
                if os.path.exists(f"{m}/memory.memsw.limit_in_bytes"):
                    _write(f"{m}/memory.memsw.limit_in_bytes", str(memory_bytes))  # no swap beyond the limit
                _write(f"{self.dirs['pids']}/pids.max", str(pids))
                _write(f"{self.dirs['cpu']}/cpu.shares", "1024")
        except OSError:
            for d in made:
                try:
                    os.rmdir(d)
                except OSError:
                    pass
            raise

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes "0" to, to join the group in every hierarchy."""
        return [f"{d}/cgroup.procs" for d in sorted(set(self.dirs.values()))]

    def runner_files(self) -> list[str]:
        """The ``cgroup.procs`` files the sample's runner joins: the groups that share out and count CPU (v1:
        ``cpu`` and ``cpuacct``; v2: the one group), so that its work for the sample is the sample's CPU."""
        if self.layout.version == 2:
            return self.procs_files()
        return [f"{d}/cgroup.procs" for d in sorted({self.dirs["cpu"], self.dirs["cpuacct"]})]

    def counters(self) -> list[tuple[str, str]]:
        """(file, key) pairs whose values sum to the times the sample hit its memory limit: OOM kills, and
        charges refused at the limit (a ``memfd``/shmem page, a kernel object: ENOMEM with no OOM kill). An
        empty key: the file holds just the number."""
        d = self.dirs["memory"]
        if self.layout.version == 2:
            return [(f"{d}/memory.events", "oom_kill"), (f"{d}/memory.events", "max")]
        return [(f"{d}/memory.oom_control", "oom_kill"), (f"{d}/memory.failcnt", "")]

    def cpu_counters(self) -> list[tuple[str, str, float]]:
        """(file, key, seconds per unit) whose values sum to the CPU time every process of the sample used:
        what tells a signal of RLIMIT_CPU (the limit was reached) from one the program sent itself."""
        if self.layout.version == 2:
            return [(f"{self.dirs['cpu']}/cpu.stat", "usage_usec", 1e-6)]
        return [(f"{self.dirs['cpuacct']}/cpuacct.usage", "", 1e-9)]

    def limit_hits(self) -> int:
        total = 0
        for path, key in self.counters():
            try:
                total += read_counter(Path(path).read_text(), key)
            except OSError:
                pass
        return total

    def pids(self) -> list[int]:
        out: set[int] = set()
        for f in self.procs_files():
            try:
                out |= {int(x) for x in Path(f).read_text().split()}
            except OSError:
                pass
        return sorted(out)

    def _empty_memory(self) -> None:
        """Uncharge the page cache the sample's reads charged to its group (files of the host's shared
        trees): a removed group whose pages are still charged lives on in the kernel, one per sample."""
        d = self.dirs["memory"]
        try:
            if self.layout.version == 1:
                _write(f"{d}/memory.force_empty", "0")
            else:
                _write(f"{d}/memory.reclaim", str(2**40))  # kernel 5.19+; older kernels: best effort
        except OSError:
            pass  # already gone, or nothing the kernel could reclaim (rmdir then still works)

    def destroy(self) -> None:
        """Kill every process still in the group, uncharge its memory, then remove it (retried while the kernel
        finishes reaping, for up to 10 s: a loaded machine may take that long to tear down a large process
        tree)."""
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            left = self.pids()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if not left:
                self._empty_memory()
            busy = False
            for d in sorted(set(self.dirs.values())):
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    busy |= e.errno == errno.EBUSY
            if not busy:
                return
            time.sleep(0.005)  # a killed task leaves the group only once it is reaped
        raise OSError(errno.EBUSY, f"cgroup {self.name} could not be removed: processes {self.pids()}")


def read_counter(text: str, key: str) -> int:
    """The value of ``key`` in a ``key value`` per line file, or the file's one number (``key`` empty)."""
    if not key:
        return int(text.strip() or 0)
    for line in text.splitlines():
        k, _, value = line.partition(" ")
        if k == key:
            return int(value)
    return 0

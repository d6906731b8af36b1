"""Issue 46, second round: every CPU cycle a sample causes is charged to the sample (its runner lives in its
cpu cgroup; the work of this process per sample is bounded), a fork server that is killed or stopped ends
its sample instead of running the top level again, what the calls of one sample share is what the docs say,
and the seccomp filter refuses every listed call, family by family. Each test marked ``old: fails`` failed
on 02c8a8c (the code before this round).

CPU is measured as CPU time (the cgroup's ``cpuacct`` counter, ``getrusage``, ``thread_time``), never as
wall-clock time, and no test waits a fixed time: they hold on a loaded machine.

Needs isolation ``full`` with every layer (root, util-linux unshare, cgroups, libseccomp): skipped otherwise.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import subprocess
import sys
import time

import pytest

from prorl_bench.config import CodeTaskConfig, RewardKind, TaskConfig
from prorl_bench.tasks.code_task import CodeTask
from prorl_bench.tasks.sandbox import SandboxLimits, isolation, layers, run_program
from prorl_bench.tasks.sandbox.cgroup import SampleCgroup
from prorl_bench.tasks.sandbox.seccomp import DENIED_SYSCALLS, UNIFIED_NUMBERS
from tests.tasks.test_sandbox_v4 import DRIP, FLOOD_CALL, FLOOD_TOP, GCD

ISO = isolation()
FULL = ISO.level == "full" and not ISO.missing
pytestmark = pytest.mark.skipif(not FULL, reason=f"needs sandbox isolation 'full' with every layer: {ISO}")


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def children_cpu() -> float:
    """CPU time of every process this one has reaped (the runner, and through it the whole sample)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@pytest.fixture
def charged(monkeypatch):
    """The CPU seconds each sample's cgroup counted, read just before the group is removed."""
    seen: list[float] = []
    real = SampleCgroup.destroy

    def destroy(self):
        cpu = 0.0
        for path, key, scale in self.cpu_counters():
            with open(path) as f:
                text = f.read()
            value = text if not key else next(x.split()[1] for x in text.splitlines() if x.startswith(key + " "))
            cpu += int(value) * scale
        seen.append(cpu)
        real(self)

    monkeypatch.setattr(SampleCgroup, "destroy", destroy)
    return seen


def uncharged_cpu(charged: list, prog: str, calls: list, entry: str = "f", **limits) -> tuple[float, object]:
    """(CPU the sample's processes used that its cgroup did not count, the result)."""
    t0 = children_cpu()
    r = run_program(prog, SandboxLimits(**{"wall_s": 30.0, **limits}), calls, entry)
    return children_cpu() - t0 - charged[-1], r


# -- item 1: the runner's CPU is the sample's


def test_the_runner_shares_the_samples_cpu_groups():
    """old: fails (the runner, root, stayed in the trainer's groups: /proc/1/cgroup showed '/')."""
    prog = (
        "def f():\n"
        "    def cpu(pid):\n"
        "        lines = open(f'/proc/{pid}/cgroup').read().splitlines()\n"
        "        v1 = [x.split(':', 1)[1] for x in lines if x.split(':')[1] in ('cpu', 'cpuacct')]\n"
        "        return sorted(v1 or [x for x in lines if x.startswith('0::')])  # v2: the one group\n"
        "    return [cpu(1), cpu('self')]\n"
    )
    r = run_program(prog, SandboxLimits(wall_s=30.0), [[]], "f")
    runner, call = r.calls[0]["value"]
    assert runner == call and all("prorl_sbx_" in x for x in runner), runner


def test_the_runners_work_per_call_is_charged_to_the_sample(charged):
    """300 calls that return at once: the runner's work for them (a pipe, a message, a scan of /proc, a
    frame per call) is most of the sample's CPU. All of it but the runner's start (the interpreter's start-up,
    before it can join the group: ~25 ms) is counted by the sample's cgroup. old: fails (0.10-0.2 s
    uncharged; 0.14 s measured)."""
    uncharged_cpu(charged, GCD, [[4, 6]], "gcd")  # warm: the first sample of a process pays for more
    lost, r = uncharged_cpu(charged, "def f(x):\n    return x\n", [[i] for i in range(300)])
    assert r.status == "ok" and len(r.calls) == 300
    assert lost < 0.08, lost


@pytest.mark.parametrize("prog", [FLOOD_TOP, FLOOD_CALL], ids=["from the top level", "from a call"])
def test_a_control_socket_flood_costs_little_and_is_charged(charged, prog):
    """A sample flooding its control socket with 1-byte messages: its whole process tree (runner
    included) uses little CPU, nearly all of it counted by its cgroup. (In the audit: 5-6.7 s of runner CPU
    outside the sample's cgroup, and the sample scored 1.0.)"""
    uncharged_cpu(charged, GCD, [[4, 6]], "gcd")
    t0 = children_cpu()
    lost, r = uncharged_cpu(charged, prog, [[12, 18], [7, 13]], "gcd")
    assert r.status == "exception", r
    assert children_cpu() - t0 < 1.0 and lost < 0.08, (children_cpu() - t0, lost)


FLOOD_THEN_BUSY = FLOOD_CALL.replace("    while b:", "    sum(range(3_000_000))\n    while b:")
BUSY_GCD = GCD.replace("    while b:", "    sum(range(3_000_000))\n    while b:")


def test_a_neighbour_of_three_flooding_samples_scores_1():
    """The task's real scoring path, a batch of three floods (from the top level, from a call, from a call
    after CPU work) and one correct program that needs CPU in each call: the correct one scores 1.0."""
    cfg = CodeTaskConfig(timeout_s=8.0, workers=4, memory_mb=256)
    task = CodeTask(TaskConfig(name="code", reward=RewardKind.partial, val_size=12, params=cfg))
    gcd = next(p for p in task._train + task._val_all if p.id == "gcd")
    progs = [FLOOD_TOP, FLOOD_CALL, FLOOD_THEN_BUSY, BUSY_GCD]
    rewards, _, infos = task.score_many([fenced(p) for p in progs], [gcd] * 4)
    assert [i["fail"] for i in infos] == ["exception"] * 3 + ["ok"] and rewards[3] == 1.0, infos


PACED = "import os, time\ndef f(n, fd):\n    for _ in range(n):\n        os.write(fd, b'x')\n"
PACED += "        time.sleep(0.0001)\n    return n\n"


@pytest.mark.parametrize("how", ["result pipe drip", "paced stdout", "paced stderr"])
def test_drips_and_paced_output_cost_this_process_bounded_cpu(how):
    """20,000 one-byte writes, each meeting an idle reader, on the call's result pipe (read by the runner,
    which sends one frame) or on stdout/stderr (read here): the CPU of the thread driving the sample stays
    bounded (the reads are paced: at most ~50 per second of the sample's limits after a burst of 64)."""
    prog, args = (DRIP, [20_000]) if how == "result pipe drip" else (PACED, [20_000, 1 if "stdout" in how else 2])
    t0 = time.thread_time()
    r = run_program(prog, SandboxLimits(wall_s=60.0, cpu_s=60), [args], "f")
    cpu = time.thread_time() - t0
    assert r.status == "ok", r
    assert cpu < 0.25, cpu


# -- item 2: a fork server killed or stopped ends the sample; the top level runs once

TOP = "import os, signal, sys, time\nprint('TOP LEVEL RAN', file=sys.stderr, flush=True)\n"
KILL_SERVER = TOP + "def f(x):\n    os.kill(os.getppid(), signal.SIGKILL)\n    return x\n"
STOP_SERVER = TOP + (
    "def state(pid):\n"
    "    return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[0]\n"
    "def f(x):\n"
    "    os.kill(os.getppid(), signal.SIGSTOP)\n"
    "    while state(os.getppid()) not in 'Tt':\n"  # until the stop took effect
    "        os.sched_yield()\n"
    "    return x\n"
)
KILL_SERVER_NO_RESULT = TOP + "def f(x):\n    os.kill(os.getppid(), signal.SIGKILL)\n    os._exit(0)\n"


@pytest.mark.parametrize(
    "prog", [KILL_SERVER, STOP_SERVER, KILL_SERVER_NO_RESULT], ids=["killed", "stopped", "killed, no result"]
)
def test_a_server_killed_or_stopped_by_a_call_ends_the_sample(prog):
    """old: fails (killed: the runner started a new server for each later call, running the top level 4
    times, and the sample scored 'ok'; stopped: the next call waited out its wall limit, 'timeout')."""
    r = run_program(prog, SandboxLimits(wall_s=60.0), [[i] for i in range(4)], "f")
    assert r.stderr.count("TOP LEVEL RAN") == 1, r.stderr
    assert r.status == "crashed", r
    assert r.calls[1:] == (None, None, None)


def test_a_top_level_that_stops_itself_is_a_crash():
    """old: fails (the runner waited out the top level's wall limit: 'timeout')."""
    prog = TOP + "os.kill(os.getpid(), signal.SIGSTOP)\ndef f(x):\n    return x\n"
    r = run_program(prog, SandboxLimits(wall_s=60.0), [[1], [2]], "f")
    assert (r.status, r.calls, r.stderr.count("TOP LEVEL RAN")) == ("crashed", (None, None), 1), r


def test_a_self_killing_server_scores_like_a_crash_through_the_task():
    cfg = CodeTaskConfig(timeout_s=30.0, workers=1, memory_mb=256)
    task = CodeTask(TaskConfig(name="code", reward=RewardKind.partial, val_size=12, params=cfg))
    gcd = next(p for p in task._train + task._val_all if p.id == "gcd")
    prog = GCD.replace("    while b:", "    import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n    while b:")
    rewards, _, infos = task.score_many([fenced(prog)], [gcd])
    assert infos[0]["fail"] == "crashed" and infos[0]["passed"] <= 1 and rewards[0] < 1.0, infos


# -- item 3: what the calls of one sample share (docs/code_task.md, "Processes of one sample")

SHARED = """
import mmap, os
SEEN = []
PAGE = mmap.mmap(-1, 4096)  # MAP_SHARED, made by the top level
MEMFD = os.memfd_create('x')
def f(i):
    SEEN.append(i)  # private memory: a copy per call
    PAGE[i] = 1  # a shared page: every call sees the earlier calls' writes
    os.pwrite(MEMFD, b'm', i)
    with open('/tmp/calls', 'a') as fh:  # the sample's private /tmp: kept across its calls
        fh.write(str(i))
    return [len(SEEN), sum(PAGE[:8]), len(os.pread(MEMFD, 8, 0)), open('/tmp/calls').read()]
"""


def test_what_the_calls_of_one_sample_share():
    """Private memory (globals, the heap) is copied per call; what the top level made shared (a MAP_SHARED
    mapping, a memfd, files in the private /tmp) is the same object in every call."""
    r = run_program(SHARED, SandboxLimits(wall_s=30.0), [[i] for i in range(3)], "f")
    assert [c["value"] for c in r.calls] == [[1, 1, 1, "0"], [1, 2, 2, "01"], [1, 3, 3, "012"]], r


# -- item 4: every call the filter lists is refused, family by family

FAMILIES = {
    "namespaces": ["unshare", "setns"],
    "keyrings": ["add_key", "keyctl", "request_key"],
    "other processes": ["ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp"],
    "kernel surfaces": [
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
    ],  # fmt: skip
    "mounts": [
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "move_mount",
        "open_tree",
        "mount_setattr",
        "open_tree_attr",
        "statmount",
        "listmount",
        "open_by_handle_at",
        "name_to_handle_at",
        "fanotify_init",
    ],  # fmt: skip
    "modules and the machine": [
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "quotactl",
        "quotactl_fd",
        "syslog",
        "vhangup",
        "lookup_dcookie",
        "uselib",
        "nfsservctl",
        "_sysctl",
    ],  # fmt: skip
    "clocks and names": [
        "settimeofday",
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "sethostname",
        "setdomainname",
    ],  # fmt: skip
    "hardware": ["iopl", "ioperm", "modify_ldt"],
    "page cache": ["fadvise64", "process_madvise", "cachestat", "mincore"],
    "writeback and memory placement": [
        "sync",
        "syncfs",
        "mbind",
        "set_mempolicy",
        "set_mempolicy_home_node",
        "migrate_pages",
        "move_pages",
        "memfd_secret",
        "process_mrelease",
        "vmsplice",
    ],  # fmt: skip
}
# Arguments no kernel accepts (a bad pointer 1, a bad descriptor -1, invalid flags): a call the filter let
# through fails with EFAULT, EBADF, EINVAL, ESRCH, ... and changes nothing (``sync`` takes no arguments: let
# through, it writes back dirty pages; ``vhangup`` in a new session without a terminal does nothing).
BAD = (-1, 1, -1, 1, 0, 0)
ARGS = {"reboot": (0, 0, 0, 1), "sethostname": (1, -1), "setdomainname": (1, -1), "iopl": (9,), "ioperm": (-1, 9, 1),
        "clock_settime": (-1, 1), "unshare": (-1,), "userfaultfd": (-1,), "io_uring_setup": (0, 1),
        "umount2": (1, -1), "syslog": (-1, 0, 0), "fanotify_init": (-1, -1)}  # fmt: skip


# calls newer than libseccomp 2.5: numbered alike on every architecture since Linux 5.1 (asm-generic)
NEW_NUMBERS = {"memfd_secret": 447, "process_mrelease": 448, "set_mempolicy_home_node": 450, "cachestat": 451,
               "statmount": 457, "listmount": 458, "open_tree_attr": 467}  # fmt: skip


def _numbers() -> dict:
    """The number of every call of FAMILIES on this architecture (the test's list, not the filter's)."""
    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    out = {}
    for name in (n for names in FAMILIES.values() for n in names):
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        nr = NEW_NUMBERS.get(name, -1) if nr < 0 else nr
        if nr >= 0:
            out[name] = nr
    return out


PROBE = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def attempt(calls):
    out = {}
    for name, nr, args in calls:
        ctypes.set_errno(0)
        rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
        out[name] = 0 if rc >= 0 else ctypes.get_errno()
    return out
"""


@pytest.fixture(scope="module")
def probe_calls() -> list:
    return [[n, nr, list(ARGS.get(n) or BAD)] for n, nr in sorted(_numbers().items())]


@pytest.fixture(scope="module")
def in_sample(probe_calls) -> dict:
    r = run_program(PROBE, SandboxLimits(wall_s=30.0), [[probe_calls]], "attempt")
    return r.calls[0]["value"]


@pytest.fixture(scope="module")
def filtered_root(probe_calls) -> dict:
    """The same calls as root (every capability) in fresh namespaces, with and without the filter: an EPERM
    there comes from the filter, not from a missing privilege."""

    def run(with_filter: bool) -> dict:
        code = PROBE + (
            "import sys\nsys.path.insert(0, sys.argv[2])\n"
            "from prorl_bench.tasks.sandbox.seccomp import export_seccomp_bpf, install_seccomp_bpf\n"
            "bpf = export_seccomp_bpf()\nos.setsid()\nlibc.prctl(38, 1, 0, 0, 0)\n"
            f"if {with_filter}:\n    install_seccomp_bpf(bpf)\n"
            "print(json.dumps(attempt(json.loads(sys.argv[1]))))\n"
        )
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        cmd = ["unshare", "--mount", "--uts", "--ipc", "--net", "--pid", "--fork", "--kill-child", sys.executable,
               "-c", code, json.dumps(probe_calls), root]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    return {"filtered": run(True), "unfiltered": run(False)}


@pytest.mark.skipif(os.getuid() != 0, reason="needs root")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_listed_call_is_refused_by_the_filter(family, in_sample, filtered_root):
    names = [n for n in FAMILIES[family] if n in filtered_root["filtered"]]
    assert names, family
    assert {n: in_sample[n] for n in names} == {n: errno.EPERM for n in names}
    assert {n: filtered_root["filtered"][n] for n in names} == {n: errno.EPERM for n in names}
    # the check can tell: without the filter, root's call reaches the kernel (which refuses the bad arguments)
    reached = {n: filtered_root["unfiltered"][n] != errno.EPERM for n in names}
    assert sum(reached.values()) >= len(names) // 2, filtered_root["unfiltered"]


def test_every_listed_call_is_in_a_family():
    assert set(DENIED_SYSCALLS) == {n for names in FAMILIES.values() for n in names}
    assert {n: NEW_NUMBERS[n] for n in UNIFIED_NUMBERS} == UNIFIED_NUMBERS
    assert layers().seccomp

"""Issue 36, one hostile test per numbered failure: no completion can crash the trainer, exhaust the machine
or change another sample's reward. Each test failed on the code before the fix (see the issue's report).

Needs isolation ``full`` with every layer (root, util-linux unshare, a cgroup hierarchy with the memory, pids
and cpu controllers, libseccomp): skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid

import pytest

from prorl_bench.config import CodeTaskConfig, RewardKind, TaskConfig
from prorl_bench.run.evaluation import score_details
from prorl_bench.tasks.code_task import CodeProblem, CodeTask
from prorl_bench.tasks.sandbox import SandboxLimits, isolation, layers, run_program
from prorl_bench.tasks.sandbox.uids import UIDS

ISO = isolation()
pytestmark = pytest.mark.skipif(
    ISO.level != "full" or bool(getattr(ISO, "missing", ())),
    reason=f"needs sandbox isolation 'full' with every layer: {ISO}",
)
MIB = 2**20
GCD = "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n"


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def make_task(wall: float = 3.0, memory_mb: int = 256, workers: int = 2) -> CodeTask:
    cfg = CodeTaskConfig(timeout_s=wall, workers=workers, memory_mb=memory_mb)
    return CodeTask(TaskConfig(name="code", reward=RewardKind.partial, val_size=12, params=cfg))


@pytest.fixture(scope="module")
def task() -> CodeTask:
    return make_task()


def problem(task: CodeTask, pid: str) -> CodeProblem:
    return next(p for p in task._train + task._val_all if p.id == pid)


def own_problem(expected: list, args: list | None = None) -> CodeProblem:
    tests = tuple({"args": [] if args is None else args[k], "expected": e} for k, e in enumerate(expected))
    return CodeProblem(prompt="p", target="", id="own", entry_point="f", tests=tests)


# -- 1. a one-line completion no longer kills the run


def test_an_overflowing_answer_fails_its_sample_only(task):
    mean = problem(task, "mean")  # expected values are floats
    good = fenced("def mean(xs):\n    return sum(xs) / len(xs)")
    bad = [
        fenced("def mean(xs):\n    return 10**400"),  # math.isclose(10**400, 2.0) raises OverflowError
        fenced("def mean(xs):\n    return float('nan')"),
        fenced("def mean(xs):\n    return float('inf')"),
        fenced("def mean(xs):\n    return 10**5000"),  # past int<->str's digit limit: unrepresentable in JSON
    ]
    rewards, success, infos = score_details(task, [good, *bad, good], [mean] * (len(bad) + 2))  # the trainer's call
    assert rewards == [1.0] + [0.0] * len(bad) + [1.0]
    assert [i["fail"] for i in infos] == ["ok", "wrong_answer", "wrong_answer", "wrong_answer", "exception", "ok"]


def test_a_scorer_failure_is_its_sample_class_only():
    """Whatever fails inside the scorer for one sample (here: an expected value no JSON can hold, so the
    comparison cannot be built) is that sample's ``scorer_error``; the batch is scored (at a rate of
    scorer errors within ``max_scorer_error_rate``: tests/tasks/test_sandbox_v4.py checks the rate above)."""
    cfg = CodeTaskConfig(timeout_s=3.0, workers=2, memory_mb=256, max_scorer_error_rate=0.5)
    task = CodeTask(TaskConfig(name="code", reward=RewardKind.partial, val_size=12, params=cfg))
    gcd = problem(task, "gcd")
    broken = own_problem([float("nan")])
    rewards, _, infos = task.score_many([fenced(GCD), fenced("def f():\n    return 1.0")], [gcd, broken])
    assert rewards == [1.0, 0.0] and [i["fail"] for i in infos] == ["ok", "scorer_error"]


# -- 2. memory is bounded per sample, not per process

MEMFDS_HELD = f"""
import os
fds = []
for _ in range(1100):  # 1,100 MiB of shared memory, in no process's RSS
    fd = os.memfd_create('x')
    os.write(fd, b'x' * {MIB})
    fds.append(fd)
{GCD}"""

MEMFDS_MAPPED = f"""
import ctypes, os
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
for _ in range(1100):  # the same, held by mappings alone (no descriptor: RLIMIT_NOFILE does not stop it)
    fd = os.memfd_create('x')
    os.ftruncate(fd, {MIB})
    addr = libc.mmap(None, {MIB}, 3, 1, fd, 0)  # PROT_READ | PROT_WRITE, MAP_SHARED
    os.close(fd)
    ctypes.memset(addr, 1, {MIB})
{GCD}"""

EIGHT_PROCESSES = f"""
import os
def gcd(a, b):
    r, w = os.pipe()
    for _ in range(8):
        if os.fork() == 0:
            os.close(r)
            x = bytearray({180 * MIB})  # touched: 180 MiB resident in each of 8 processes at once
            os.write(w, b'1')
            os.close(w)
            while True:
                os.pause()
    os.close(w)
    got = b''
    while len(got) < 8:  # every child allocated (8 bytes), or every write end closed (some died)
        chunk = os.read(r, 8)
        if not chunk:
            return -1
        got += chunk
    while b:
        a, b = b, a % b
    return a
"""


def test_memfds_neither_score_nor_hold_host_memory(task):
    gcd = problem(task, "gcd")
    rewards, _, infos = task.score_many([fenced(MEMFDS_HELD), fenced(MEMFDS_MAPPED)], [gcd, gcd])
    assert rewards == [0.0, 0.0], infos
    assert infos[1]["fail"] == "memory"  # the sample's memory cgroup killed it (its own counter)
    assert sample_groups() == []  # nothing holds the memory afterwards: no process, no group of ours left


def sample_groups() -> list[str]:
    """The cgroups of this process's samples still present in any hierarchy."""
    lay = layers().cgroup
    return [f"{d}/{n}" for d in lay.dirs() for n in os.listdir(d) if n.startswith(f"prorl_sbx_{os.getpid()}_")]


def test_processes_of_a_sample_share_one_memory_limit(task):
    gcd = problem(task, "gcd")
    rewards, _, infos = task.score_many([fenced(EIGHT_PROCESSES)], [gcd])
    assert (rewards[0], infos[0]["fail"]) == (0.0, "memory")


def test_open_files_are_limited():
    prog = "import resource\ndef f():\n    return resource.getrlimit(resource.RLIMIT_NOFILE)"
    r = run_program(prog, SandboxLimits(wall_s=5), [[]], "f")
    soft, hard = r.calls[0]["value"]
    assert 0 < soft <= hard <= 64


# -- 3. the trainer's own memory does not grow with what samples return


def _peak_rss_growth(fn) -> tuple[object, int]:
    def read(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = read("VmRSS:")
    out = fn()
    return out, read("VmHWM:") - before


TRAINER_BOUND = 64 * MIB  # stated in docs/code_task.md: batch of 8 x 4 calls x ~1 MiB of JSON each


def test_huge_return_values_keep_the_trainer_within_a_bound(task):
    gcd = problem(task, "gcd")
    huge = fenced("def gcd(a, b):\n    return [[]] * 260000")  # 1.04 MB of JSON, ~25x that as Python objects
    (rewards, _, infos), growth = _peak_rss_growth(lambda: task.score_many([huge] * 8, [gcd] * 8))
    assert rewards == [0.0] * 8 and {i["fail"] for i in infos} == {"wrong_answer"}
    assert growth < TRAINER_BOUND, growth / MIB


# -- 4. one sample cannot slow its neighbours

HOG = """
import os
for _ in range(120):
    if os.fork() == 0:
        os.setsid()  # a session (an autogroup) of its own
        while True:
            pass
while True:
    pass
"""


# ~50 ms of CPU per call: under 120 sessions of a hog it needs seconds, under a fair share a fraction of one
BUSY_GCD = GCD.replace("    while b:", "    sum(range(3_000_000))\n    while b:")


def test_a_setsid_hog_does_not_slow_correct_neighbours():
    t = make_task(wall=8.0, workers=3)
    gcd = problem(t, "gcd")
    lim = t.limits
    object.__setattr__(t, "limits", SandboxLimits(**{**lim.__dict__, "nproc": 256}))  # a strong hog
    rewards, _, infos = t.score_many([fenced(HOG), fenced(BUSY_GCD), fenced(BUSY_GCD)], [gcd] * 3)
    assert rewards[1:] == [1.0, 1.0], infos
    assert infos[0]["fail"] == "timeout"


# -- 5. runs never share sample uids; nothing a sample leaves survives it

RUN_ONE = """
import json, sys
from prorl_bench.tasks.sandbox import SandboxLimits, run_program
r = run_program(sys.argv[1], SandboxLimits(wall_s=10), [[sys.argv[2]]], "f", level="full")
print(json.dumps(r.calls[0]))
"""


def _run_in_new_process(program: str, arg: str) -> object:
    """One sample scored by a new Python process (a run of its own), started outside the checkout: the
    installed package, as a user's run imports it."""
    with tempfile.TemporaryDirectory() as cwd:
        out = subprocess.run([sys.executable, "-c", RUN_ONE, program, arg], capture_output=True, text=True,
                             check=True, cwd=cwd)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_runs_never_share_a_uid():
    prog = "import os\ndef f(x):\n    return os.getuid()"
    a, b = (_run_in_new_process(prog, "x")["value"] for _ in range(2))
    assert a != b and a > 0 and b > 0


KEYS = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_add_key, SYS_keyctl, KEY_SPEC_USER_KEYRING, KEYCTL_SEARCH = 248, 250, -4, 10
def f(desc):
    if desc.startswith('add:'):
        return libc.syscall(SYS_add_key, b'user', desc[4:].encode(), b'secret', 6, KEY_SPEC_USER_KEYRING)
    return libc.syscall(SYS_keyctl, KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, b'user', desc.encode(), 0)
"""


def test_a_kernel_key_left_by_a_sample_is_invisible_to_a_later_run():
    desc = f"prorl_v3_{uuid.uuid4().hex}"
    _run_in_new_process(KEYS, "add:" + desc)
    assert _run_in_new_process(KEYS, desc) == {"value": -1}  # not found (or keyctl refused)


def test_a_forked_scorer_never_reuses_its_parents_uids():
    """A process forked after its parent reserved a block (e.g. a worker pool) reserves its own."""
    first = UIDS.take(200000)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, str(UIDS.take(200000)).encode())
        os._exit(0)
    os.close(w)
    child = int(os.read(r, 64))
    os.waitpid(pid, 0)
    assert child not in {first, UIDS.take(200000)} and all(child not in b for b in UIDS.reserved())


SYSV = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def f(key, create):
    return libc.shmget(key, 4096, (0o1000 | 0o600) if create else 0o600)  # IPC_CREAT
"""


def test_sysv_ipc_left_by_a_sample_is_gone():
    key = 0x5EED0000 + os.getpid() % 0xFFFF
    lim = SandboxLimits(wall_s=10)
    assert run_program(SYSV, lim, [[key, True]], "f").calls[0]["value"] >= 0  # made in the sample
    assert run_program(SYSV, lim, [[key, False]], "f").calls == ({"value": -1},)  # not in the next one
    import ctypes

    assert ctypes.CDLL(None).shmget(key, 4096, 0o600) == -1  # nor on the host


# -- 6. the capabilities and socket families the design says are gone

ATTEMPTS = """
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS = 0x10000000, 0x40000000, 0x00020000
SIGCHLD = 17
NR = {'clone': 56, 'clone3': 435, 'keyctl': 250, 'ptrace': 101, 'bpf': 321, 'perf_event_open': 298,
      'io_uring_setup': 425, 'userfaultfd': 323, 'mount': 165, 'setns': 308}

def raw_clone(flags):
    pid = libc.syscall(NR['clone'], flags | SIGCHLD, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
        return 'allowed'
    return 'refused'

def sock(family, kind=socket.SOCK_STREAM):
    try:
        socket.socket(family, kind).close()
        return 'allowed'
    except OSError:
        return 'refused'

def call(name, *args):
    return 'allowed' if libc.syscall(NR[name], *args) >= 0 else 'refused'

def attempt(what):
    if what == 'unshare_user':
        return 'allowed' if libc.unshare(CLONE_NEWUSER) == 0 else 'refused'
    if what == 'unshare_net':
        return 'allowed' if libc.unshare(CLONE_NEWNET) == 0 else 'refused'
    if what in ('clone_newuser', 'clone_newns', 'clone_newnet'):
        return raw_clone({'clone_newuser': CLONE_NEWUSER, 'clone_newns': CLONE_NEWUSER | CLONE_NEWNS,
                          'clone_newnet': CLONE_NEWUSER | CLONE_NEWNET}[what])
    if what == 'clone3':
        args = (ctypes.c_uint64 * 11)()
        args[0] = CLONE_NEWUSER
        args[4] = SIGCHLD
        pid = libc.syscall(NR['clone3'], ctypes.byref(args), 88)
        if pid == 0:
            os._exit(0)
        return 'allowed' if pid > 0 else 'refused'
    if what == 'keyctl':
        return call('keyctl', 0, -4, 0)  # KEYCTL_GET_KEYRING_ID of the user keyring
    if what == 'af_vsock':
        return sock(40)
    if what == 'af_alg':
        return sock(38, socket.SOCK_SEQPACKET)
    if what == 'af_netlink':
        return sock(16, socket.SOCK_RAW)
    if what == 'af_packet':
        return sock(17, socket.SOCK_RAW)
    if what == 'sock_raw':
        return sock(socket.AF_INET, socket.SOCK_RAW)
    if what == 'ptrace':
        return call('ptrace', 0, 0, 0, 0)  # PTRACE_TRACEME
    if what == 'perf_event_open':
        attr = (ctypes.c_uint8 * 128)()
        ctypes.c_uint32.from_buffer(attr, 4).value = 128
        ctypes.c_uint32.from_buffer(attr, 0).value = 1  # PERF_TYPE_SOFTWARE, config 0: cpu clock
        return call('perf_event_open', ctypes.byref(attr), 0, -1, -1, 0)
    if what == 'io_uring_setup':
        params = (ctypes.c_uint8 * 120)()
        return call('io_uring_setup', 4, ctypes.byref(params))
    if what == 'userfaultfd':
        return call('userfaultfd', 0)
    if what == 'bpf':
        return call('bpf', 0, 0, 0)
    raise ValueError(what)
"""
SURFACE = [
    "unshare_user", "unshare_net", "clone_newuser", "clone_newns", "clone_newnet", "clone3", "keyctl", "af_vsock",
    "af_alg", "af_netlink", "af_packet", "sock_raw", "ptrace", "perf_event_open", "io_uring_setup", "userfaultfd",
    "bpf",
]  # fmt: skip


def test_namespaces_keyrings_and_kernel_surfaces_are_refused():
    r = run_program(ATTEMPTS, SandboxLimits(wall_s=10), [[w] for w in SURFACE], "attempt")
    got = {w: (c or {}).get("value", c) for w, c in zip(SURFACE, r.calls)}
    assert got == {w: "refused" for w in SURFACE}


def test_threads_subprocesses_and_unix_sockets_still_work():
    """What the filter refuses is what no test program needs: clone without namespace flags (threads, fork,
    posix_spawn) and AF_UNIX / AF_INET sockets are allowed."""
    prog = (
        "import socket, subprocess, threading\n"
        "def f():\n"
        "    out = []\n"
        "    t = threading.Thread(target=lambda: out.append(1)); t.start(); t.join()\n"
        "    a, b = socket.socketpair(); a.sendall(b'x'); out.append(b.recv(1).decode())\n"
        "    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()\n"
        "    out.append(subprocess.run(['/bin/echo', 'hi'], capture_output=True, text=True).stdout)\n"
        "    return out\n"
    )
    r = run_program(prog, SandboxLimits(wall_s=10), [[]], "f")
    assert r.calls == ({"value": [1, "x", "hi\n"]},)


# -- 7. a strict, total comparison; failure classes the sample cannot choose


@pytest.mark.parametrize(
    "returned,expected,passes",
    [
        ("3628803.3", 3628800, False),  # within 1e-6 relative of an int expectation: still wrong
        ("3628800.0", 3628800, False),  # an int test wants an int
        ("3628800", 3628800, True),
        ("False", 0, False),  # bool is not int
        ("True", 1, False),
        ("0", False, False),
        ("False", False, True),
        ("2", 2.0, False),  # a float test wants a float
        ("2.0000000001", 2.0, True),  # within the documented tolerance of a float expectation
        ("2.01", 2.0, False),
        ("[1, 2.0]", [1, 2.0], True),
        ("[1.0, 2.0]", [1, 2.0], False),
        ("{'a': [0.1 + 0.2]}", {"a": [0.3]}, True),
        ("{'a': 1}", {"a": True}, False),
        ("{1: 2}", {"1": 2}, True),  # JSON object keys are strings (documented)
        ("(1, 2)", [1, 2], True),  # a tuple is a JSON array
    ],
)
def test_the_comparison_is_strict_and_total(task, returned, expected, passes):
    rewards, _, infos = task.score_many([fenced(f"def f():\n    return {returned}")], [own_problem([expected])])
    assert rewards == [float(passes)], infos


def test_a_home_made_memory_error_is_not_a_memory_failure(task):
    gcd = problem(task, "gcd")
    progs = [
        "class MemoryError(Exception):\n    pass\ndef gcd(a, b):\n    raise MemoryError('pretend')",
        "def gcd(a, b):\n    raise MemoryError",  # the builtin, raised by hand: no limit was hit
        "class MemoryError(Exception):\n    pass\nraise MemoryError",  # at import
    ]
    _, _, infos = task.score_many([fenced(p) for p in progs], [gcd] * len(progs))
    assert [i["fail"] for i in infos] == ["exception"] * len(progs)


# -- 8. one execution per sample


def test_the_top_level_runs_once_and_each_call_gets_a_fresh_copy():
    prog = (
        "import os\n"
        "with open('/tmp/runs', 'a') as fh:\n"  # /tmp is the sample's own: it outlives each call
        "    fh.write('x')\n"
        "seen = []\n"
        "def f(x):\n"
        "    seen.append(x)\n"
        "    return [len(open('/tmp/runs').read()), len(seen)]\n"
    )
    r = run_program(prog, SandboxLimits(wall_s=10), [[k] for k in range(5)], "f")
    assert r.calls == tuple({"value": [1, 1]} for _ in range(5))


def test_a_slow_import_is_not_timed_out_by_a_shared_wall_limit():
    prog = "import time\ntime.sleep(0.6)\ndef f(x):\n    return x + 1\n"
    r = run_program(prog, SandboxLimits(wall_s=2.0, cpu_s=2), [[k] for k in range(8)], "f")
    assert (r.status, r.calls) == ("ok", tuple({"value": k + 1} for k in range(8)))

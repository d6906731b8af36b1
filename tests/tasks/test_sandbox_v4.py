"""Issue 46, one hostile test per attack: a sample pays for its own CPU, its fate is observed (never
reported), uids cannot repeat, a broken sandbox stops the run, nothing is left behind or reached. Each test
marked ``old: fails`` failed on the code before issue 46 (062a1f0), run with this file (with the module
paths of its flat layout: ``sandbox_uids``, ``sandbox.SampleCgroup``; SandboxBroken read as SandboxError).

Needs isolation ``full`` with every layer (root, util-linux unshare, a cgroup hierarchy with the memory,
pids, cpu (and v1: cpuacct) controllers, libseccomp): skipped with the reason otherwise; the uid-counter
tests need only a writable temporary directory (and root for the live-process one).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import prorl_bench.tasks.sandbox as sandbox
import prorl_bench.tasks.sandbox.harness as harness
import prorl_bench.tasks.sandbox.uids as uids
from prorl_bench.config import CodeTaskConfig, RewardKind, TaskConfig
from prorl_bench.run.evaluation import score_details
from prorl_bench.tasks.code_task import CodeProblem, CodeTask
from prorl_bench.tasks.sandbox import SandboxLimits, isolation, layers, run_program
from prorl_bench.tasks.sandbox.cgroup import SampleCgroup

SandboxBroken = sandbox.SandboxBroken
ISO = isolation()
FULL = ISO.level == "full" and not ISO.missing
needs_full = pytest.mark.skipif(not FULL, reason=f"needs sandbox isolation 'full' with every layer: {ISO}")
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root (a process of another uid)")
GCD = "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n"
# a program's way to its server's control socket: the one socket among its descriptors
FIND_CTL = """
import os, socket, stat
CTL = next(fd for fd in range(3, 64) if _isfd(fd) and stat.S_ISSOCK(os.fstat(fd).st_mode))
CTL_SOCK = socket.socket(fileno=os.dup(CTL))
"""
ISFD = """
import os
def _isfd(fd):
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
"""


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def make_task(wall: float = 3.0, workers: int = 2, **code) -> CodeTask:
    cfg = CodeTaskConfig(timeout_s=wall, workers=workers, memory_mb=256, **code)
    return CodeTask(TaskConfig(name="code", reward=RewardKind.partial, val_size=12, params=cfg))


def gcd_problem(task: CodeTask) -> CodeProblem:
    return next(p for p in task._train + task._val_all if p.id == "gcd")


# -- item 4: a broken sandbox stops the run; a sample's misbehaviour stays its own class


@needs_full
def test_an_unusable_scratch_directory_stops_the_run(monkeypatch, tmp_path):
    """old: fails (every sample silently scorer_error, reward 0, nothing raised)."""
    task = make_task()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))  # the scratch directory's parent vanished
    with pytest.raises(SandboxBroken, match="scratch directory"):
        score_details(task, [fenced(GCD)] * 2, [gcd_problem(task)] * 2)  # the trainer's call


@needs_full
def test_a_cgroup_that_cannot_be_made_stops_the_run(monkeypatch):
    """old: fails (scorer_error per sample)."""
    task = make_task()

    def refuse(self, memory_bytes: int, pids: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", self.name)  # v1: the kernel's memcg id limit

    monkeypatch.setattr(SampleCgroup, "create", refuse)
    with pytest.raises(SandboxBroken, match="cgroup"):
        task.score_many([fenced(GCD)], [gcd_problem(task)])


@needs_full
@pytest.mark.parametrize("content", ["", "\n", "20x0\n"])
def test_a_corrupt_uid_counter_stops_the_run(monkeypatch, tmp_path, content):
    """old: fails (an empty counter restarted at the bottom: every uid handed out again; a corrupt one was
    the sample's scorer_error)."""
    (tmp_path / "sandbox_uids").write_text(content)
    monkeypatch.setenv("PRORL_BENCH_SANDBOX_STATE", str(tmp_path))
    monkeypatch.setattr(uids, "DEFAULT_STATE", tmp_path, raising=False)
    monkeypatch.setattr(harness, "UIDS", uids.UidPool())  # a fresh process's pool: it must read the counter
    task = make_task()
    with pytest.raises(SandboxBroken, match="sandbox_uids"):
        task.score_many([fenced(GCD)], [gcd_problem(task)])


@needs_full
def test_a_seccomp_filter_that_cannot_be_loaded_stops_the_run(monkeypatch):
    """old: fails (the server's set-up failure was the sample's ``exception``, reward 0)."""
    real = layers()
    bad = sandbox.Layers(real.cgroup, b"\x00" * 8, real.missing)  # one instruction, no return: EINVAL
    monkeypatch.setattr(harness, "layers", lambda: bad)
    task = make_task()
    with pytest.raises(SandboxBroken, match="could not be set up.*PR_SET_SECCOMP"):
        task.score_many([fenced(GCD)], [gcd_problem(task)])


@needs_full
def test_a_scorer_error_rate_above_the_threshold_stops_the_run():
    """old: fails (no threshold: any share of scorer errors trained on as zeros)."""
    task = make_task(max_scorer_error_rate=0.25)
    gcd = gcd_problem(task)
    broken = CodeProblem(
        prompt="p", target="", id="own", entry_point="f", tests=({"args": [], "expected": float("nan")},)
    )
    ok = fenced("def f():\n    return 1.0")
    _, _, infos = task.score_many([fenced(GCD)] * 3 + [ok], [gcd] * 3 + [broken])  # 1 of 4: at the threshold
    assert [i["fail"] for i in infos] == ["ok"] * 3 + ["scorer_error"]
    with pytest.raises(SandboxBroken, match=r"2 of 4 samples.*max_scorer_error_rate=0.25"):
        task.score_many([fenced(GCD)] * 2 + [ok] * 2, [gcd] * 2 + [broken] * 2)


# -- item 2: the class is observed, never reported


def _status(prog: str, **limits) -> tuple[str, tuple]:
    r = run_program(prog, SandboxLimits(**{"wall_s": 30.0, "cpu_s": 1, **limits}), [[1]], "f")
    return r.status, r.calls


SELF_XCPU_TOP = "import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)\ndef f(x):\n    return x\n"
SELF_KILL_TOP = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\ndef f(x):\n    return x\n"
SELF_XCPU_CALL = "import os, signal\ndef f(x):\n    os.kill(os.getpid(), signal.SIGXCPU)\n"
SELF_KILL_CALL = "import os, signal\ndef f(x):\n    os.kill(os.getpid(), signal.SIGKILL)\n"
# the server's "call 0 ended" message, forged by the call with the status of a CPU-limit kill (SIGXCPU)
FORGED_STATUS = (
    ISFD
    + FIND_CTL
    + "import signal\n"
    + "def f(x):\n"
    + "    CTL_SOCK.send(b'D' + (0).to_bytes(4, 'little') + int(signal.SIGXCPU).to_bytes(4, 'little'))\n"
    + "    os.kill(os.getpid(), signal.SIGSTOP)\n"  # then wait, stopped, to be killed
)


@needs_full
@pytest.mark.parametrize(
    "prog,want",
    [
        (SELF_XCPU_TOP, "crashed"),  # old: timeout (in 0.08 s)
        (SELF_KILL_TOP, "crashed"),  # old: killed
        (SELF_XCPU_CALL, "exception"),  # old: timeout (the server's word for the call's status)
        (SELF_KILL_CALL, "exception"),  # old: killed
        (FORGED_STATUS, "exception"),  # old: timeout
    ],
    ids=["self-SIGXCPU top level", "self-SIGKILL top level", "self-SIGXCPU call", "self-SIGKILL call", "forged status"],
)
def test_a_program_cannot_choose_its_failure_class(prog, want):
    """old: fails for every case."""
    assert _status(prog)[0] == want


@needs_full
@pytest.mark.parametrize("where", ["top level", "call"])
def test_a_real_cpu_limit_is_still_a_timeout(where):
    """The RLIMIT_CPU kill is ``timeout`` because the cgroup's CPU counter shows the limit was used (the
    wall limit, 30 s, is far away)."""
    loop = "    while True:\n        pass\n"
    prog = "while True:\n    pass\ndef f(x):\n    return x\n" if where == "top level" else f"def f(x):\n{loop}"
    status, _ = _status(prog)
    assert status == "timeout"


# -- item 1: a sample pays for its own CPU

FLOOD_TOP = (
    ISFD
    + FIND_CTL
    + (
        "import threading\n"
        "def flood():\n"
        "    while True:\n"
        "        CTL_SOCK.send(b'x')\n"
        "threading.Thread(target=flood, daemon=True).start()\n" + GCD  # runs on in the server while the calls run
    )
)
FLOOD_CALL = (
    ISFD
    + FIND_CTL
    + GCD.replace("    while b:", "    for _ in range(20000):\n        CTL_SOCK.send(b'x')\n    while b:")
)


@needs_full
@pytest.mark.parametrize("prog", [FLOOD_TOP, FLOOD_CALL], ids=["from the top level", "from a call"])
def test_a_control_socket_flood_ends_the_sample(prog):
    """old: fails (the runner read every message, 5-6.7 s of its CPU, and the sample scored 1.0)."""
    task = make_task()
    rewards, _, infos = task.score_many([fenced(prog)], [gcd_problem(task)])
    assert (rewards, infos[0]["fail"]) == ([0.0], "exception")


# ~50 ms of CPU per call: beside three floods that cost the runner CPU it needs the share it is owed
BUSY_GCD = GCD.replace("    while b:", "    sum(range(3_000_000))\n    while b:")


@needs_full
def test_the_neighbours_of_three_flooding_samples_score_1():
    task = make_task(wall=8.0, workers=5)
    progs = [FLOOD_TOP] * 3 + [BUSY_GCD] * 2
    rewards, _, infos = task.score_many([fenced(p) for p in progs], [gcd_problem(task)] * 5)
    assert rewards[3:] == [1.0, 1.0], infos


RUNNER_CPU = """
import os, time
def runner_cpu():  # PID 1 of the sample's pid namespace is its runner
    fields = open('/proc/1/stat').read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')
"""
# The attacks pace their writes (0.1 ms apart: the program's own choice, not the test waiting), so that each
# byte reaches an idle reader: one wake-up per byte unless the reader bounds its reads.
DRIP = (
    ISFD
    + RUNNER_CPU
    + (
        "import stat\n"
        "def f(n):\n"
        "    pipe = next(fd for fd in range(3, 64) if _isfd(fd) and stat.S_ISFIFO(os.fstat(fd).st_mode))\n"
        "    before = runner_cpu()\n"
        "    for _ in range(n):\n"
        "        os.write(pipe, b' ')  # whitespace before the JSON: still a valid result\n"
        "        time.sleep(0.0001)\n"
        "    return runner_cpu() - before\n"
    )
)


@needs_full
def test_dripping_the_result_pipe_costs_the_runner_little():
    """old: fails (one runner wake-up per byte: 0.38 s of runner CPU here for 20,000 bytes; 1.3-2.2 s per
    sample in the audit)."""
    r = run_program(DRIP, SandboxLimits(wall_s=60.0, cpu_s=60), [[20_000]], "f")
    assert r.status == "ok" and r.calls[0]["value"] < 0.15, r


PACED = (
    "import os, time\ndef f(n, fd):\n    for _ in range(n):\n        os.write(fd, b'x')\n        time.sleep(0.0001)\n"
)
PACED += "    return n\n"


@needs_full
@pytest.mark.parametrize("fd", [1, 2], ids=["stdout", "stderr"])
def test_paced_output_costs_the_trainer_little(fd):
    """A correct program writing one byte per write, 20,000 times. old: fails (one trainer wake-up per
    write: 0.41 s of trainer CPU here; 1.9-2.9 s per sample in the audit)."""
    t0 = time.thread_time()  # this thread drives the sample (run_program reads its output here)
    r = run_program(PACED, SandboxLimits(wall_s=60.0, cpu_s=60), [[20_000, fd]], "f")
    cpu = time.thread_time() - t0
    assert r.status == "ok" and r.calls == ({"value": 20_000},), r
    assert cpu < 0.2, cpu


# -- item 3: uids that cannot repeat


@pytest.mark.parametrize("content", ["", "\n", "abc\n"])
def test_an_empty_or_corrupt_counter_is_an_error(monkeypatch, tmp_path, content):
    """old: fails for an empty counter (read as "start again at the bottom")."""
    (tmp_path / "sandbox_uids").write_text(content)
    monkeypatch.setenv("PRORL_BENCH_SANDBOX_STATE", str(tmp_path))
    with pytest.raises(uids.UidError, match="sandbox_uids"):
        uids.reserve_block(200000)


def test_an_interrupted_counter_write_never_hands_a_block_out_twice(monkeypatch, tmp_path):
    """A crash while the counter is written (here: the write fails) must leave it as it was. old: fails (the
    counter was truncated, then rewritten in place: left empty, it handed every block out again)."""
    monkeypatch.setenv("PRORL_BENCH_SANDBOX_STATE", str(tmp_path))
    first = uids.reserve_block(200000)
    real_write, real_pwrite = os.write, os.pwrite

    def inside(fd: int) -> bool:
        return os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path))

    def boom(fd, *args):
        if inside(fd):
            raise OSError(errno.EIO, "simulated crash while writing the counter")
        return (real_pwrite if len(args) == 2 else real_write)(fd, *args)

    monkeypatch.setattr(os, "write", boom)
    monkeypatch.setattr(os, "pwrite", boom)
    with pytest.raises(RuntimeError):
        uids.reserve_block(200000)
    monkeypatch.setattr(os, "write", real_write)
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    try:
        again = uids.reserve_block(200000)
    except uids.UidError:
        return  # refusing is safe too
    assert not set(again) & set(first)


@needs_root
def test_a_block_with_a_live_process_is_skipped(monkeypatch, tmp_path):
    """old: fails (the block was handed out with a process of one of its uids alive: a fork bomb of a
    sample of another counter would share its uid)."""
    start = 1_900_000_000
    (tmp_path / "sandbox_uids").write_text(f"{start}\n")
    monkeypatch.setenv("PRORL_BENCH_SANDBOX_STATE", str(tmp_path))
    squatter = subprocess.Popen(["cat"], user=start + 5, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        block = uids.reserve_block(200000)
    finally:
        squatter.stdin.close()
        squatter.wait()
    assert start + 5 not in block and block.start >= start


HOLD = """
import os, sys
from pathlib import Path
import prorl_bench.tasks.sandbox.uids as u
u.DEFAULT_STATE = Path(sys.argv[1])  # the machine-wide default, for this test: a temporary directory
try:
    print(u.UIDS.take(200000), flush=True)
except RuntimeError as e:
    print("refused:", e, flush=True)
sys.stdin.read()  # hold the counter until the test closes stdin
"""


def _holder(default: Path, state: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PRORL_BENCH_SANDBOX_STATE": str(state)}
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(default)], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    return p, p.stdout.readline().strip()  # its first line: the uid it took, or why it was refused


@pytest.mark.parametrize("first_default", [True, False], ids=["default first", "elsewhere first"])
def test_two_runs_with_different_state_dirs_never_share_a_uid(tmp_path, first_default):
    """old: fails (each directory had its own counter: both runs handed out uid 200000)."""
    default, other = tmp_path / "default", tmp_path / "other"
    a_dir, b_dir = (default, other) if first_default else (other, default)
    a, a_said = _holder(default, a_dir)
    try:
        b, b_said = _holder(default, b_dir)
        b.stdin.close()
        b.wait()
    finally:
        a.stdin.close()
        a.wait()
    assert a_said.isdigit(), a_said
    assert b_said.startswith("refused:") or (b_said.isdigit() and b_said != a_said), (a_said, b_said)
    if b_said.startswith("refused:"):
        assert "another run" in b_said and str(a_dir) in b_said


# -- item 5: nothing left, nothing reached

PAGE_CACHE = """
import ctypes, errno, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {'statmount': 457, 'listmount': 458, 'open_tree_attr': 467}
def attempt(what):
    fd = os.open(os.__file__, os.O_RDONLY)  # the stdlib: a file whose page cache the host shares
    try:
        if what == 'fadvise_dontneed':
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                return 'allowed'
            except OSError:
                return 'refused'
        if what in ('madvise_pageout', 'madvise_cold', 'madvise_dontneed_anonymous'):
            m = mmap.mmap(-1 if what.endswith('anonymous') else fd, 4096, mmap.MAP_PRIVATE, mmap.PROT_READ)
            advice = {'madvise_pageout': 21, 'madvise_cold': 20, 'madvise_dontneed_anonymous': 4}[what]
            try:
                m.madvise(advice)
                return 'allowed'
            except OSError:
                return 'refused'
        ctypes.set_errno(0)
        rc = libc.syscall(NR[what], 0, 0, 0, 0)
        return 'refused' if rc < 0 and ctypes.get_errno() == errno.EPERM else 'reached the kernel'
    finally:
        os.close(fd)
"""
REACH = ["fadvise_dontneed", "madvise_pageout", "madvise_cold", "statmount", "listmount", "open_tree_attr"]


@needs_full
def test_the_host_page_cache_and_new_mount_calls_are_out_of_reach():
    """old: fails (fadvise/madvise evicted the host's cached stdlib; statmount, listmount, open_tree_attr
    reached the kernel: libseccomp 2.5 does not know their names)."""
    what = [*REACH, "madvise_dontneed_anonymous"]
    r = run_program(PAGE_CACHE, SandboxLimits(wall_s=10), [[w] for w in what], "attempt")
    got = {w: (c or {}).get("value", c) for w, c in zip(what, r.calls)}
    assert got == {**{w: "refused" for w in REACH}, "madvise_dontneed_anonymous": "allowed"}


def _memory_cgroups() -> int:
    with open("/proc/cgroups") as f:
        return next(int(line.split()[2]) for line in f if line.startswith("memory"))


READ_FILES = """
import os
def f(k):
    files = []
    for root, _, names in os.walk('/usr/share'):
        files += [os.path.join(root, x) for x in names]
    for p in files[k::97][:40]:  # files no one read lately: their page cache is charged to this sample
        try:
            with open(p, 'rb') as fh:
                fh.read(65536)
        except OSError:
            pass
    return k
"""


@needs_full
def test_samples_leave_no_memory_cgroup_behind():
    """old: fails (one removed memory cgroup per sample lived on, pinned by the page cache it was charged
    for: +19-20 per 20 samples). Other processes of the machine may make groups meanwhile: a margin of 8."""
    if layers().cgroup.version != 1:
        pytest.skip("counted through /proc/cgroups (cgroup v1)")
    before = _memory_cgroups()
    offset = os.getpid() % 97
    for k in range(20):
        run_program(READ_FILES, SandboxLimits(wall_s=20), [[(offset + k) % 97]], "f")
    assert _memory_cgroups() - before < 8


def test_the_default_counter_location_is_documented():
    text = (Path(__file__).resolve().parents[2] / "docs" / "code_task.md").read_text()
    assert str(uids.DEFAULT_STATE) in text and "PRORL_BENCH_SANDBOX_STATE" in text and "counters/" in text


def test_the_sandbox_package_is_small_modules_of_short_functions():
    """Issue 44: ``tasks/sandbox/`` is a package, every module <= 400 lines, every function <= 80."""
    import ast

    pkg = Path(sandbox.__file__).parent
    lengths, sizes = {}, {}
    for path in sorted(pkg.glob("*.py")):
        source = path.read_text()
        sizes[path.name] = source.count("\n")
        lengths |= {
            f"{path.stem}.{node.name}": node.end_lineno - node.lineno + 1
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
    assert {"harness.py", "runner.py", "cgroup.py", "seccomp.py", "uids.py"} <= set(sizes)
    assert max(sizes.values()) <= 400, sizes
    longest = max(lengths, key=lengths.get)
    assert lengths[longest] <= 80, f"{longest} is {lengths[longest]} lines"

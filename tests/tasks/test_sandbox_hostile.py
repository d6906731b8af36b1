"""Hostile programs against task=code's sandbox, one test per attack of issue 24.

Each cheat is first shown to work outside the sandbox (where that is meaningful), then scored through
``CodeTask.score_many``: the cheats score 0, a correct program 1, a partial one its fraction; nothing the
sample writes is left outside it, no host socket is reached, the scoring process's memory stays bounded and
no process of the sample survives scoring. Needs isolation ``full`` (root + util-linux unshare): skipped
with the reason otherwise.
"""

from __future__ import annotations

import os
import socket
import sys

import pytest

from prorl_bench.config import CodeTaskConfig, RewardKind, TaskConfig
from prorl_bench.tasks.code_task import DATA_DIR, CodeTask
from prorl_bench.tasks.sandbox import WALL_MARGIN_S, SandboxLimits, isolation, run_program
from prorl_bench.tasks.sandbox.uids import UIDS

ISO = isolation()
if ISO.level != "full":
    print(f"test_sandbox_hostile: skipped, isolation {ISO.level!r}: {ISO.reason}", file=sys.stderr)
pytestmark = pytest.mark.skipif(ISO.level != "full", reason=f"needs sandbox isolation 'full': {ISO.reason}")

UID = 310000  # where this file's uid counter starts (each sample still gets a uid never used before)
WALL = 2.0  # seconds: generous, so that a loaded machine does not turn a correct program into a timeout
GCD = "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n"


@pytest.fixture(scope="module")
def task() -> CodeTask:
    cfg = CodeTaskConfig(timeout_s=WALL, workers=2, memory_mb=256)
    t = CodeTask(TaskConfig(name="code", reward=RewardKind.partial, val_size=12, params=cfg))
    object.__setattr__(t, "limits", SandboxLimits(wall_s=WALL, cpu_s=1, memory_bytes=256 * 2**20, uid=UID))
    return t


@pytest.fixture(scope="module")
def gcd(task):
    return next(p for p in task._train if p.id == "gcd")


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def score(task, gcd, program: str) -> tuple[float, dict]:
    rewards, _, infos = task.score_many([fenced(program)], [gcd])
    return rewards[0], infos[0]


def sample_processes() -> list[tuple[int, int]]:
    """(pid, uid) of every host process running as a uid this process's samples ran as."""
    ours = UIDS.reserved()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if any(uid in block for block in ours):
            out.append((int(d), uid))
    return out


def run_here(program: str, entry: str, args: list) -> object:
    """The program run in this process, unsandboxed: what the cheat gets where nothing stops it."""
    scope: dict = {"__name__": "cheat"}
    exec(compile(program, "<cheat>", "exec"), scope)
    return scope[entry](*args)


# -- a correct program still scores 1, a partial one its fraction


def test_correct_scores_one_and_partial_its_fraction(task, gcd):
    assert score(task, gcd, GCD) == (1.0, {"fail": "ok", "passed": 4, "tests": 4})
    # right only where a == b or the gcd is 1: (7, 13) and (9, 9) of the four tests
    assert score(task, gcd, "def gcd(a, b):\n    return a if a == b else 1")[0] == 0.5


# -- attack: read the shipped problem file and return the stored answer

READ_DATASET = f"""
import json, os, sys
ROOTS = [{str(DATA_DIR)!r}, 'prorl_bench/data/code', 'data/code']  # absolute, and relative to the cwd
ROOTS += [os.path.join(p, 'prorl_bench', 'data', 'code') for p in sys.path]  # an installed package
def gcd(a, b):
    for d in ROOTS:
        for name in ('train.jsonl', 'val.jsonl'):
            try:
                lines = open(os.path.join(d, name)).read().splitlines()
            except OSError:
                continue
            for line in lines:
                for t in json.loads(line)['tests']:
                    if t['args'] == [a, b] and json.loads(line)['id'] == 'gcd':
                        return t['expected']
    return -1
"""


def test_reading_the_dataset_earns_nothing(task, gcd):
    assert [run_here(READ_DATASET, "gcd", t["args"]) for t in gcd.tests] == [t["expected"] for t in gcd.tests]
    reward, info = score(task, gcd, READ_DATASET)
    assert (reward, info["fail"]) == (0.0, "wrong_answer")  # every call ran and returned -1: no file found


# -- attack: forge the result channel, then exit before the function runs

ANSWERS = {"(12, 18)": 6, "(7, 13)": 1, "(100, 75)": 25, "(9, 9)": 9}
FORGE = f"""
import json, os, sys
answers = {list(ANSWERS.values())!r}
junk = []  # anything that could be a nonce or name a channel, from every place readable
for pid in ('self', '1'):
    for name in ('cmdline', 'environ'):
        try:
            junk += open(f'/proc/{{pid}}/{{name}}', 'rb').read().replace(b'\\0', b' ').split()
        except OSError:
            pass
junk += [a.encode() for a in sys.argv]
frames = b''  # the runner's own frame format, one well-formed frame per test, with the right answers
for i, v in enumerate(answers):
    payload = json.dumps({{'value': v}}).encode()
    frames += json.dumps({{'i': i, 'kind': 'result', 'n': len(payload)}}).encode() + b'\\n' + payload
for fd in range(0, 256):  # onto every descriptor this process holds
    try:
        os.write(fd, frames)
    except OSError:
        pass
for n in junk[:200]:  # and the old nonce-tagged line format on stdout
    for i, v in enumerate(answers):
        sys.stdout.write('\\n%s %d %s\\n' % (n.decode(errors='replace'), i, json.dumps({{'value': v}})))
sys.stdout.flush()
os._exit(0)
def gcd(a, b):
    return -1
"""


def test_forged_results_then_exit_earn_nothing(task, gcd):
    reward, info = score(task, gcd, FORGE)
    assert (reward, info["fail"], info["passed"]) == (0.0, "exception", 0)


def test_a_value_written_to_the_own_call_pipe_counts_as_returning_it(task, gcd):
    """What a call's process writes on its own result pipe is its answer to that call, nothing more: the
    same reward as returning that value, never credit for another call."""
    pipe_write = (
        "import os, stat\n"
        "def gcd(a, b):\n"
        "    for fd in range(3, 64):\n"
        "        try:\n"
        "            if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
        "                os.write(fd, b'{\"value\": 6}')\n"
        "        except OSError:\n"
        "            pass\n"
        "    os._exit(0)\n"
    )
    assert score(task, gcd, pipe_write) == score(task, gcd, "def gcd(a, b):\n    return 6")
    assert score(task, gcd, pipe_write)[0] == 0.25  # only (12, 18) -> 6
    # at the top level the program holds no call's pipe: writing on every pipe there and exiting earns nothing
    top_level = pipe_write.replace("def gcd(a, b):\n", "if True:\n")
    assert score(task, gcd, top_level) == (0.0, {"fail": "exception", "passed": 0, "tests": 4})


# -- attack: leave files in /tmp and /dev/shm, reach a host Unix socket, read the host's /proc


def test_tmp_and_shm_are_private_and_vanish(task, gcd, tmp_path):
    marker = f"prorl_hostile_{os.getpid()}"
    writer = (
        "import os\n"
        "def gcd(a, b):\n"
        f"    for d in ('/tmp', '/dev/shm'):  # writable (a private tmpfs): these must succeed\n"
        f"        open(d + '/{marker}', 'w').write('x')\n"
        f"    for d in ('/var/tmp', '/run', '/', '/usr'):\n"
        "        try:\n"
        f"            open(d + '/{marker}', 'w').write('x')\n"
        "        except OSError:\n"
        "            pass\n"
        "    while b:\n"
        "        a, b = b, a % b\n"
        "    return a\n"
    )
    assert score(task, gcd, writer)[0] == 1.0
    for d in ("/tmp", "/dev/shm", "/var/tmp", "/run", "/", "/usr"):
        assert not os.path.exists(f"{d}/{marker}"), d
    lister = "import os\ndef gcd(a, b):\n    return sorted(os.listdir('/tmp')) + sorted(os.listdir('/dev/shm'))"
    r = run_program(lister, SandboxLimits(wall_s=5, uid=UID), [[1, 2]], "gcd")
    assert r.calls == ({"value": []},)  # the next sample starts empty


def test_host_unix_sockets_unreachable(tmp_path):
    os.chmod(tmp_path, 0o777)
    path = str(tmp_path / "s.sock")
    abstract = f"\0prorl_hostile_{os.getpid()}"
    servers = []
    for addr in (path, abstract):
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(addr)
        srv.listen(8)
        srv.setblocking(False)
        servers.append(srv)
    os.chmod(path, 0o777)
    prog = (
        "import socket\n"
        "def gcd(a, b):\n"
        "    reached = 0\n"
        f"    for addr in ({path!r}, {abstract!r}):\n"
        "        try:\n"
        "            c = socket.socket(socket.AF_UNIX); c.connect(addr); c.sendall(b'hi'); reached += 1\n"
        "        except OSError:\n"
        "            pass\n"
        "    return reached\n"
    )
    assert run_here(prog, "gcd", [1, 1]) == 2  # outside the sandbox both are reachable
    for srv in servers:  # drop the connections made just now
        while True:
            try:
                srv.accept()[0].close()
            except BlockingIOError:
                break
    r = run_program(prog, SandboxLimits(wall_s=5, uid=UID), [[1, 1]], "gcd")
    assert r.calls == ({"value": 0},)
    for srv in servers:
        with pytest.raises(BlockingIOError):
            srv.accept()
        srv.close()


def test_host_proc_invisible(task, gcd):
    prog = (
        "import os\n"
        "def gcd(a, b):\n"
        "    cmds = []\n"
        "    for d in os.listdir('/proc'):\n"
        "        if d.isdigit():\n"
        "            try:\n"
        "                cmds.append(open('/proc/%s/cmdline' % d, 'rb').read().decode(errors='replace'))\n"
        "            except OSError:\n"
        "                pass\n"
        "    return cmds\n"
    )
    assert any("pytest" in c for c in run_here(prog, "gcd", [1, 1]))
    r = run_program(prog, SandboxLimits(wall_s=5, uid=UID), [[1, 2]], "gcd")
    cmds = r.calls[0]["value"]
    assert len(cmds) == 3 and not any("pytest" in c for c in cmds)  # the runner, the server, this call's copy


def test_hidden_paths_inside_a_bound_tree_are_empty(tmp_path):
    """A project installed inside a bound tree (e.g. /usr/lib/python3/dist-packages/prorl_bench) is hidden:
    checked with a directory of /usr that exists, listed outside and empty inside."""
    target = next((d for d in ("/usr/share/doc", "/usr/share", "/usr/lib") if os.listdir(d)), None)
    if target is None:
        pytest.skip("no non-empty directory under /usr to hide")
    prog = f"import os\ndef f():\n    return os.listdir({target!r})"
    lim = SandboxLimits(wall_s=5, uid=UID)
    assert run_program(prog, lim, [[]], "f").calls[0]["value"] != []  # bound: visible
    assert run_program(prog, lim, [[]], "f", hide=[target]).calls == ({"value": []},)


# -- attack: flood stdout / stderr, overrun the time limit


def _peak_rss_growth(fn) -> tuple[object, int]:
    """(fn(), growth of this process's peak RSS in bytes while fn ran), via clear_refs' peak reset."""

    def read(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = read("VmRSS:")
    out = fn()
    return out, read("VmHWM:") - before


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_flood_is_cut_at_the_cap(task, gcd, stream):
    flood = f"import sys\nchunk = 'x' * 65536\nwhile True:\n    sys.{stream}.write(chunk)\n"
    (rewards, _, infos), growth = _peak_rss_growth(lambda: task.score_many([fenced(flood)], [gcd]))
    assert (rewards[0], infos[0]["fail"]) == (0.0, "output_limit")
    cap = task.limits.max_output_bytes
    assert growth < 16 * cap  # the cap plus read buffers, not the flood


def test_huge_return_value_is_cut_at_the_cap(task, gcd):
    prog = "def gcd(a, b):\n    return 'x' * (8 * 2**20)"
    (rewards, _, infos), growth = _peak_rss_growth(lambda: task.score_many([fenced(prog)], [gcd]))
    assert (rewards[0], infos[0]["fail"]) == (0.0, "output_limit")
    assert growth < 16 * task.limits.max_result_bytes


@pytest.mark.parametrize("prog", ["while True:\n    pass", "import time\ntime.sleep(60)"])
def test_time_limit_enforced_within_the_margin(prog):
    lim = SandboxLimits(wall_s=WALL, cpu_s=30, uid=UID)  # the CPU limit cannot end it first
    r = run_program(prog, lim)
    assert r.status == "timeout"
    # the kill itself is immediate; the slack covers process teardown on a loaded machine
    assert r.wall_s < WALL + WALL_MARGIN_S + 1.5, r.wall_s


# -- attack: fork bombs and daemons that outlive their sample


def test_no_process_survives_the_sample(task, gcd):
    bomb = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execv('/usr/bin/sleep', ['sleep', '1000'])\n"
        "    os._exit(0)\n"
        "def gcd(a, b):\n"
        "    while True:\n"
        "        try:\n"
        "            os.fork()\n"
        "        except OSError:\n"
        "            time.sleep(0.01)\n"
    )
    assert not sample_processes()
    reward, info = score(task, gcd, bomb)
    # a copy whose fork fails (the sample's pids or memory cgroup) may raise and report that: still 0
    assert reward == 0.0 and info["fail"] in ("timeout", "exception", "memory")
    assert sample_processes() == []


def test_a_wide_process_tree_is_gone_when_scoring_returns():
    """1000 processes (the teardown of a pid namespace this size is not instant): none left at return."""
    tree = (
        "import os, time\n"
        "for _ in range(10):\n"  # 2**10 processes
        "    os.fork()\n"
        "time.sleep(60)\n"
    )
    r = run_program(tree, SandboxLimits(wall_s=WALL, cpu_s=30, nproc=4096, memory_bytes=64 * 2**20, uid=UID))
    left = sample_processes()
    assert r.status in ("timeout", "memory") and left == []  # 1024 processes may pass the sample's 64 MiB


def test_many_samples_in_parallel_leave_nothing(task, gcd):
    """Several hostile samples at once (threads driving sandboxes), then the host is clean."""
    progs = [GCD, READ_DATASET, FORGE, "import os\nwhile True:\n    os.fork()", "x = bytearray(10**10)"]
    rewards, _, infos = task.score_many([fenced(p) for p in progs], [gcd] * len(progs))
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0]
    fails = [i["fail"] for i in infos]
    assert fails[:3] + fails[4:] == ["ok", "wrong_answer", "exception", "memory"]
    assert fails[3] in ("exception", "timeout")  # the bomb's first failed fork raises, unless time runs out first
    assert sample_processes() == []

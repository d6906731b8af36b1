"""Sandbox throughput, and what each hostile program of tests/tasks/test_sandbox_hostile.py gets.

    PYTHONPATH=. python benchmarks/bench_sandbox.py [workers]            # programs/s: trivial, timing out
    PYTHONPATH=. python benchmarks/bench_sandbox.py --attacks            # the threat-model table

``--attacks`` scores each hostile program once for the problem ``gcd`` (4 tests, ``wall_s=2``) and prints a
Markdown table: reward, failure class, wall time, growth of this process's peak RSS while scoring, and the
processes of the sample still alive afterwards (docs/code_task.md).
"""

from __future__ import annotations

import sys
import time

from prorl_bench.tasks.sandbox import SandboxLimits, isolation, run_many


def throughput(workers: int) -> None:
    lim = SandboxLimits(wall_s=1.0, cpu_s=1)
    print(f"isolation={isolation().level} workers={workers}")
    for name, src in (("trivial", "print(1)"), ("timeout", "while True: pass")):
        t0 = time.monotonic()
        res = run_many([src] * 64, lim, workers=workers)
        dt = time.monotonic() - t0
        statuses = sorted({r.status for r in res})
        print(f"{name}: 64 programs in {dt:.2f} s = {64 / dt:.1f} programs/s; statuses={statuses}")


def attacks() -> None:
    from prorl_bench.config import CodeTaskConfig, RewardKind, TaskConfig
    from prorl_bench.tasks.code_task import CodeTask
    from tests.tasks.test_sandbox_hostile import (
        FORGE,
        GCD,
        READ_DATASET,
        UID,
        _peak_rss_growth,
        fenced,
        sample_processes,
    )
    from tests.tasks.test_sandbox_v3 import EIGHT_PROCESSES, HOG, MEMFDS_HELD, MEMFDS_MAPPED

    task = CodeTask(TaskConfig(name="code", reward=RewardKind.partial, code=CodeTaskConfig(timeout_s=2.0, workers=1)))
    task.limits = SandboxLimits(wall_s=2.0, cpu_s=2, memory_bytes=256 * 2**20, uid=UID)
    gcd = next(p for p in task._train if p.id == "gcd")
    progs = {
        "correct gcd": GCD,
        "half right": "def gcd(a, b):\n    return a if a == b else 1",
        "read the problem files": READ_DATASET,
        "forge frames on every fd + `os._exit(0)`": FORGE,
        "stdout flood": "import sys\nchunk = 'x' * 65536\nwhile True:\n    sys.stdout.write(chunk)\n",
        "stderr flood": "import sys\nchunk = 'x' * 65536\nwhile True:\n    sys.stderr.write(chunk)\n",
        "8 MiB return value": "def gcd(a, b):\n    return 'x' * (8 * 2**20)",
        "busy loop": "while True:\n    pass",
        "sleep": "import time\ntime.sleep(60)",
        "fork bomb + setsid daemon": (
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/usr/bin/sleep', ['sleep', '1000'])\n"
            "def gcd(a, b):\n    while True:\n        try:\n            os.fork()\n        except OSError:\n"
            "            time.sleep(0.01)\n"
        ),
        "1,100 memfds of 1 MiB, held by descriptors": MEMFDS_HELD,
        "1,100 memfds of 1 MiB, held by mappings": MEMFDS_MAPPED,
        "8 processes x 180 MiB (limit 256 MiB)": EIGHT_PROCESSES,
        "1 MB of JSON per call": "def gcd(a, b):\n    return [[]] * 260000",
        "120 busy processes, each after setsid()": HOG,
    }
    print(f"isolation: {isolation().level}")
    print("| program | reward | class | wall s | scorer peak-RSS growth MiB | sample processes left |")
    print("|---|---|---|---|---|---|")
    for name, src in progs.items():
        t0 = time.perf_counter()
        (r, _, info), growth = _peak_rss_growth(lambda src=src: task.score_many([fenced(src)], [gcd]))
        wall = time.perf_counter() - t0
        left = len(sample_processes())
        print(f"| {name} | {r[0]:.2f} | {info[0]['fail']} | {wall:.2f} | {growth / 2**20:.1f} | {left} |")


if __name__ == "__main__":
    if "--attacks" in sys.argv[1:]:
        attacks()
    else:
        throughput(int(sys.argv[1]) if len(sys.argv) > 1 else 16)

"""Sandbox throughput: programs/s for 64 trivial and 64 timing-out (wall_s=1) programs.

Run: PYTHONPATH=. python benchmarks/bench_sandbox.py [workers]
"""

from __future__ import annotations

import sys
import time

from prorl_bench.sandbox import SandboxLimits, isolation_level, run_many


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    lim = SandboxLimits(wall_s=1.0, cpu_s=1)
    print(f"isolation={isolation_level()} workers={workers}")
    for name, src in (("trivial", "print(1)"), ("timeout", "while True: pass")):
        t0 = time.monotonic()
        res = run_many([src] * 64, lim, workers=workers)
        dt = time.monotonic() - t0
        statuses = sorted({r.status for r in res})
        print(f"{name}: 64 programs in {dt:.2f} s = {64 / dt:.1f} programs/s; statuses={statuses}")


if __name__ == "__main__":
    main()

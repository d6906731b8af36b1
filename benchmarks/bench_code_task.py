"""Throughput of task=code scoring: a rollout-sized batch of completions through the sandbox.

    PYTHONPATH=. python benchmarks/bench_code_task.py [--n 64] [--workers 8] [--repeats 3]

Reports programs/s (median of the repeats) for correct programs and for programs that loop
until the timeout (1 s here), and the isolation level in force.
"""

from __future__ import annotations

import argparse
import statistics
import time

from prorl_bench.code_task import CodeTask
from prorl_bench.config import CodeTaskConfig, RewardKind, TaskConfig
from prorl_bench.sandbox import isolation_level


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    cfg = CodeTaskConfig(timeout_s=1.0, workers=args.workers)
    task = CodeTask(TaskConfig(name="code", reward=RewardKind.partial, code=cfg))
    problems = (task._train * (args.n // len(task._train) + 1))[: args.n]
    kinds = {
        "correct": [f"```python\n{p.solution}\n```" for p in problems],
        "timeout": ["```python\nwhile True:\n    pass\n```"] * args.n,
    }
    print(f"isolation: {isolation_level()}, {args.n} programs, {args.workers} workers")
    for name, completions in kinds.items():
        rates = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            task.score_many(completions, problems)
            rates.append(args.n / (time.perf_counter() - t0))
        print(f"{name:8s} {statistics.median(rates):6.1f} programs/s (median of {args.repeats})")


if __name__ == "__main__":
    main()

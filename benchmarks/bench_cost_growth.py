"""How the time per RL step grows with completion length, batch size and model width.

    python benchmarks/bench_cost_growth.py [--steps 6] [--threads 2]

Native policy, variant A1, no warm-up (random init: completions run to the full budget), the
default 2 PPO epochs x 2 minibatches. One axis varies at a time around the default point
(reverse_digits with 6 digits -> 7 completion tokens, 8 x 8 samples, d_model 128 x 4 layers).
Prints the median step time over the timed steps and each stage's share of it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from prorl_bench.config import AlgoConfig, Config, HardwareConfig, ModelConfig, TaskConfig, WarmupConfig
from prorl_bench.run.trainer import train

STAGES = ("rollout", "old_logprob", "ref_logprob", "update")


def point(digits: int = 6, prompts: int = 8, width: int = 128, steps: int = 6, threads: int = 2) -> dict:
    cfg = Config(
        task=TaskConfig(name="reverse_digits", min_len=digits, max_len=digits),
        model=ModelConfig(d_model=width, n_layers=4, n_heads=4, max_seq_len=2 * digits + 8),
        algo=AlgoConfig(prompts_per_step=prompts, group_size=8),
        hardware=HardwareConfig(torch_threads=threads, deterministic=False),
        warmup=WarmupConfig(enabled=False),
        steps=steps + 1,
        eval_every=10**6,
        progress=False,
    )
    with tempfile.TemporaryDirectory() as d:
        train(cfg, Path(d) / "run", Path(d) / "cache", threads=threads)
        from prorl_bench.run.outputs import read_jsonl

        rows = read_jsonl(Path(d) / "run" / "metrics.jsonl")[1:]
    step = statistics.median(r["time/step"] for r in rows)
    return {
        "step_ms": step * 1e3,
        **{s: statistics.median(r[f"time/{s}"] for r in rows) / step for s in STAGES},
        "mfu": statistics.median(r["perf/mfu"] for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    axes = [
        ("completion tokens", "digits", [3, 6, 12, 24], lambda v: v + 1),
        ("batch (samples)", "prompts", [2, 8, 32], lambda v: v * 8),
        ("d_model", "width", [64, 128, 256], lambda v: v),
    ]
    print("| axis | value | ms/step | rollout | old_logprob | ref_logprob | update | MFU |")
    print("|---|---|---|---|---|---|---|---|")
    for name, key, values, shown in axes:
        for v in values:
            r = point(**{key: v}, steps=a.steps, threads=a.threads)
            shares = " | ".join(f"{r[s]:.0%}" for s in STAGES)
            print(f"| {name} | {shown(v)} | {r['step_ms']:.0f} | {shares} | {r['mfu']:.1%} |", flush=True)


if __name__ == "__main__":
    main()

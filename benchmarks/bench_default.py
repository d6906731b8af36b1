"""Throughput of the default experiment, per variant: steps/s, tokens/s, MFU, stage shares.

    python benchmarks/bench_default.py [--steps 60] [--threads 2] [--rounds 1] [hydra overrides ...]

Runs the default config (regime v2: sort_digits, tiny model, 8 prompts x 8 samples, 2 PPO epochs x 2
minibatches) for each of A0, A1, A2, B in this process, drops the first 5 steps (allocator and
cache warm-up), and prints per-step medians. MFU is against the measured fp32 matmul peak.
``--rounds N`` runs the variants N times in alternation (A0, A1, ..., A0, A1, ...) and prints, per
variant, the median over rounds of its time per step relative to A1's in the same round, with the
range: a ratio that background load drifting over minutes hits alike on both sides.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from prorl_bench.cli.app import CONF_DIR
from prorl_bench.config import register_configs, to_config
from prorl_bench.run.accounting import STAGES, measured_matmul_peak
from prorl_bench.run.outputs import read_jsonl
from prorl_bench.run.trainer import train


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default="A0,A1,A2,B")
    ap.add_argument("--rounds", type=int, default=1, help="alternations of the variants (ratios per round)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    register_configs()
    tmp = Path(tempfile.mkdtemp(prefix="prorl-bench-"))
    results, ratios = {}, {}
    for r in range(args.rounds):
        times = {}
        for variant in args.variants.split(","):
            with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
                raw = compose(
                    "config",
                    overrides=[
                        f"variant={variant}",
                        f"steps={args.steps}",
                        f"eval_every={args.steps}",
                        *args.overrides,
                    ],
                )
            cfg = to_config(raw)
            train(cfg, tmp / f"{variant}_{r}", Path("outputs/base_cache").resolve(), threads=args.threads)
            rows = read_jsonl(tmp / f"{variant}_{r}" / "metrics.jsonl")[5:]
            med = {k: statistics.median(x[k] for x in rows) for k in rows[0] if isinstance(rows[0][k], (int, float))}
            results[variant] = med  # the last round's, for the table
            times[variant] = med["time/step"]
        if "A1" in times:
            for v, t in times.items():
                ratios.setdefault(v, []).append(t / times["A1"])
    import torch

    torch.set_num_threads(args.threads)
    peak = measured_matmul_peak(torch.device("cpu"))
    print(
        f"\nthreads={args.threads}  measured fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s  "
        f"(median over steps 6..{args.steps})\n"
    )
    head = f"{'variant':8}{'steps/s':>9}{'tok/s':>9}{'samples/s':>11}{'MFU':>7}{'ref fwd':>9}{'ref tok':>9}"
    head += "".join(f"{s:>13}" for s in STAGES if s not in ("reset", "growth"))
    print(head)
    for v, m in results.items():
        line = (
            f"{v:8}{1 / m['time/step']:9.2f}{m['throughput/tokens_per_s']:9.0f}"
            f"{m['throughput/samples_per_s']:11.0f}{m['perf/mfu']:7.1%}"
            f"{m['count/ref_fwd']:9.0f}{m['tokens/ref_fwd']:9.0f}"
        )
        line += "".join(f"{m[f'time/{s}'] / m['time/step']:13.1%}" for s in STAGES if s not in ("reset", "growth"))
        print(line)
    a1 = results.get("A1")
    if a1:
        print()
        for v, m in results.items():
            print(
                f"{v}: time/step {m['time/step'] * 1e3:.1f} ms = {m['time/step'] / a1['time/step']:.2f}x A1; "
                f"ref time {m['time/ref_logprob'] * 1e3:.2f} ms/step"
            )

    if args.rounds > 1 and ratios:
        print(f"\ntime per step relative to A1 in the same round, median [min, max] over {args.rounds} rounds:")
        for v, rs in ratios.items():
            print(f"{v}: {statistics.median(rs):.3f} [{min(rs):.3f}, {max(rs):.3f}]")


if __name__ == "__main__":
    main()

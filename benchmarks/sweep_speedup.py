"""Parallel speed-up of a sweep: the same grid with joblib n_jobs=2 vs n_jobs=1 (wall time).

    python benchmarks/sweep_speedup.py                       # +sweep=ablation_small, full length
    python benchmarks/sweep_speedup.py steps=30 seed=0,1     # any Hydra override is passed through

Both runs use the identical grid and one torch thread per job (multirun mode), and the warm-up base is
cached beforehand, so the only difference is how many jobs run at once. The aggregation callback is
disabled so only the multirun itself is timed. Prints and writes outputs/benchmarks/sweep_speedup.json.
A benchmark, not a test: numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRID = "+sweep=ablation_small"


def timed(args: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "prorl_bench.app", *args], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(args)}\n{proc.stderr[-3000:]}")
    return wall


def main(overrides: list[str]) -> dict:
    out_dir = Path("outputs/benchmarks")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="speedup-") as tmp:
        # cache the warm-up base once (it is keyed by task/model/warmup, shared by every job)
        timed(["steps=1", "progress=false", f"hydra.run.dir={tmp}/warm", *overrides])
        walls = {}
        for n_jobs in (2, 1):
            walls[n_jobs] = timed(["-m", GRID, f"hydra.launcher.n_jobs={n_jobs}", f"hydra.sweep.dir={tmp}/n{n_jobs}",
                                   "hydra.callbacks={}", *overrides])
            n_runs = sum(1 for _ in Path(f"{tmp}/n{n_jobs}").glob("*/summary.json"))
            print(f"n_jobs={n_jobs}: {walls[n_jobs]:.1f} s wall for {n_runs} runs", flush=True)
    result = {
        "grid": GRID,
        "overrides": overrides,
        "cpus": os.cpu_count(),
        "wall_s_n_jobs_1": walls[1],
        "wall_s_n_jobs_2": walls[2],
        "speedup": walls[1] / walls[2],
        "runs": n_runs,
    }
    (out_dir / "sweep_speedup.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"speed-up 2 workers vs 1: {result['speedup']:.2f}x  ({walls[1]:.1f} s -> {walls[2]:.1f} s)")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])

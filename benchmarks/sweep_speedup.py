"""Parallel speed-up of a sweep: the same grid with joblib n_jobs=2 vs n_jobs=1 (wall time).

    python benchmarks/sweep_speedup.py                       # +sweep=ablation_small, full length
    python benchmarks/sweep_speedup.py steps=30 seed=0,1     # any Hydra override is passed through
    REPEATS=3 python benchmarks/sweep_speedup.py steps=40    # alternate 2,1,1,2,... and take medians

Both runs use the identical grid and one torch thread per job (multirun mode), and the warm-up base is
cached beforehand, so the only difference is how many jobs run at once. The aggregation callback is
disabled so only the multirun itself is timed. Prints and writes outputs/benchmarks/sweep_speedup.json.
A benchmark, not a test: numbers depend on the machine and on what else runs on it — each sample
records the CPU seconds other processes used meanwhile, so a contended measurement shows as such.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRID = "+sweep=ablation_small"


def machine_busy_s() -> float:
    """CPU seconds all processes on this machine have spent busy since boot (from /proc/stat)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def timed(args: list[str]) -> dict[str, float]:
    """Wall seconds of ``prorl-bench ARGS``, its CPU seconds, and CPU seconds used by everything else."""
    ru0, busy0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), machine_busy_s(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "prorl_bench.cli.app", *args], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    ru1, busy1 = resource.getrusage(resource.RUSAGE_CHILDREN), machine_busy_s()
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(args)}\n{proc.stderr[-3000:]}")
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "others_cpu_s": max(0.0, busy1 - busy0 - cpu)}


def main(overrides: list[str], repeats: int = 1) -> dict:
    out_dir = Path("outputs/benchmarks")
    out_dir.mkdir(parents=True, exist_ok=True)
    walls: dict[int, list[float]] = {1: [], 2: []}
    samples = []
    with tempfile.TemporaryDirectory(prefix="speedup-") as tmp:
        # cache the warm-up base once (it is keyed by task/model/warmup, shared by every job)
        timed(["steps=1", "progress=false", f"hydra.run.dir={tmp}/warm", *overrides])
        order = [2, 1, 1, 2] * repeats
        for i, n_jobs in enumerate(order[: 2 * repeats]):
            sweep_dir = f"{tmp}/r{i}_n{n_jobs}"
            t = timed(
                [
                    "-m",
                    GRID,
                    f"hydra.launcher.n_jobs={n_jobs}",
                    f"hydra.sweep.dir={sweep_dir}",
                    "~hydra.callbacks.aggregate",
                    *overrides,
                ]
            )
            n_runs = sum(1 for _ in Path(sweep_dir).glob("*/summary.json"))
            walls[n_jobs].append(t["wall_s"])
            samples.append({"n_jobs": n_jobs, **t})
            print(
                f"n_jobs={n_jobs}: {t['wall_s']:.1f} s wall for {n_runs} runs, {t['cpu_s'] / t['wall_s']:.2f} cores "
                f"busy with the sweep, {t['others_cpu_s'] / t['wall_s']:.2f} cores used by other processes",
                flush=True,
            )
    med = {n: statistics.median(w) for n, w in walls.items()}
    result = {
        "grid": GRID,
        "overrides": overrides,
        "cpus": os.cpu_count(),
        "samples": samples,  # others_cpu_s > 0: the machine was shared, the speed-up is understated
        "median_wall_s_n_jobs_1": med[1],
        "median_wall_s_n_jobs_2": med[2],
        "speedup": med[1] / med[2],
        "runs_per_sweep": n_runs,
    }
    (out_dir / "sweep_speedup.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"speed-up 2 workers vs 1: {result['speedup']:.2f}x  ({med[1]:.1f} s -> {med[2]:.1f} s, medians)")
    return result


if __name__ == "__main__":
    main(sys.argv[1:], repeats=int(os.environ.get("REPEATS", "1")))

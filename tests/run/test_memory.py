"""A run's resident memory: the trend figures as mathematics, and a real run whose memory stays flat.

The soak test is the regression test of issue 48: before the fix, the static decoder's persistent KV
cache chained every rollout's autograd graph onto the last, so a run grew by ~4.5 MB per step at the
default batch (~1.2 MB per step at this test's 16 samples: a slope of ~120 MB per 100 steps, against a
bound of 15). The slope is a least-squares fit over ~150 per-step readings, so one noisy reading on a
loaded machine moves it little.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from prorl_bench.run.memory import RSS_KEY, ols_slope, rss_mb, rss_trend

EXE = str(Path(sys.executable).with_name("prorl-bench"))


def test_ols_slope_recovers_a_line_and_its_least_squares_fit():
    xs = [float(x) for x in range(10)]
    assert ols_slope(xs, [3.0 - 0.5 * x for x in xs]) == pytest.approx(-0.5)
    # brute force: the slope minimises the squared error (a perturbed slope does worse)
    ys = [1.0, 3.0, 2.0, 5.0, 4.0, 6.0]
    xs = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    b = ols_slope(xs, ys)

    def sse(slope: float) -> float:
        a = sum(ys) / len(ys) - slope * sum(xs) / len(xs)
        return sum((y - a - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))

    assert b == pytest.approx(31 / 35)  # closed form: Sxy / Sxx = 15.5 / 17.5
    assert sse(b) < sse(b + 1e-3) and sse(b) < sse(b - 1e-3)
    assert math.isnan(ols_slope([1.0], [2.0])) and math.isnan(ols_slope([2.0, 2.0], [1.0, 3.0]))


def _rows(rss: list[float], start: int = 1) -> list[dict]:
    return [{"step": start + i, RSS_KEY: v} for i, v in enumerate(rss)]


def test_rss_trend_fits_after_the_warmup_window_only():
    # 1000 steps: flat at 500 MB from step 200 on, a steep rise before it (allocator warm-up) is ignored
    rows = _rows([100.0 + 2 * i for i in range(199)] + [500.0] * 801)
    t = rss_trend(rows, steps=1000)
    assert t["mem/rss_slope_mb_per_100_steps"] == pytest.approx(0.0, abs=1e-9)
    assert t["mem/rss_warm_mb"] == 500.0 and t["mem/rss_peak_mb"] == 500.0
    # a leak of 0.25 MB per step after step 200 is 25 MB per 100 steps
    rows = _rows([500.0 + 0.25 * i for i in range(1000)])
    assert rss_trend(rows, 1000)["mem/rss_slope_mb_per_100_steps"] == pytest.approx(25.0)
    # a short run fits its second half; too few readings give NaN, not a number
    assert rss_trend(_rows([float(i) for i in range(40)]), 40)["mem/rss_warm_mb"] == 19.0
    assert math.isnan(rss_trend(_rows([1.0] * 5), 5)["mem/rss_slope_mb_per_100_steps"])


def test_rss_mb_reads_this_process():
    before = rss_mb()
    block = bytearray(64 * 2**20)  # touched: 64 MB resident
    for i in range(0, len(block), 4096):
        block[i] = 1
    assert rss_mb() - before > 50
    del block


@pytest.mark.slow
def test_a_run_holds_flat_memory_over_hundreds_of_steps(tmp_path, base_cache):
    """The installed entry point, 300 steps of the default regime at 16 samples a step, no evaluation
    after the base's: the summary's RSS slope over steps 150-300 stays near 0 (it was ~120 MB/100 steps)."""
    args = [
        EXE, "steps=300", "eval_every=1000", "algo.prompts_per_step=4", "algo.group_size=4",
        "warmup.target_success=0.05", "task.val_size=16", "eval.n_samples=2", "eval.ks=[1,2]",
        f"run_dir={tmp_path / 'run'}", f"warmup.cache_dir={base_cache}", "progress=false",
        "hardware.torch_threads=1", "checkpoint.every=0",
    ]  # fmt: skip
    subprocess.run(args, cwd=tmp_path, check=True, capture_output=True, text=True)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r[RSS_KEY] > 0 for r in rows)
    slope = summary["mem/rss_slope_mb_per_100_steps"]
    assert slope < 15.0, f"resident memory grows {slope:.1f} MB per 100 steps"
    assert summary["mem/rss_peak_mb"] <= 1.2 * summary["mem/rss_warm_mb"]

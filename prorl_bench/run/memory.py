"""A run's resident memory, read every step, and its trend: a leak is seen in the run's own files.

``mem/rss_mb`` (a metrics row key) is the process's resident set size after the step, read from
``/proc/self/statm`` (Linux; a few microseconds). The summary fits a least-squares line to it over the
steps after a warm-up (allocator pools, caches and the first evaluation fill in the early steps):

- ``mem/rss_slope_mb_per_100_steps``: the slope of that line, MB per 100 RL steps. A run that holds a
  constant working set has a slope near 0; a leak of x MB per step shows as 100·x.
- ``mem/rss_peak_mb``: the largest per-step reading of this run (unlike ``mem/peak_rss_mb``, the
  process's ``ru_maxrss``, which in a sweep worker includes earlier jobs).
- ``mem/rss_warm_mb``: the reading at the first step of the fitted window, the baseline the peak is
  compared against (``peak / warm`` near 1 for a run without growth).

The window starts at step ``min(RSS_WARMUP_STEPS, steps // 2)``: after step 200 for a long run, the
second half of a short one. Fewer than ``RSS_MIN_POINTS`` readings give NaN (no trend to speak of).
"""

from __future__ import annotations

import math
import os
from typing import Any

RSS_KEY = "mem/rss_mb"
RSS_WARMUP_STEPS = 200
RSS_MIN_POINTS = 10
_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 4096 / 2**20


def rss_mb() -> float:
    """The calling process's resident set size now, in MB (NaN where /proc is not available)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_MB
    except (OSError, ValueError, IndexError):
        return float("nan")


def ols_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys on xs (NaN for fewer than two distinct xs)."""
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return float("nan")
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def rss_trend(history: list[dict[str, Any]], steps: int) -> dict[str, float]:
    """The summary's memory-trend figures from the metrics rows (see the module docstring)."""
    start = min(RSS_WARMUP_STEPS, steps // 2)
    pts = [
        (float(r["step"]), float(r[RSS_KEY]))
        for r in history
        if r["step"] >= start and isinstance(r.get(RSS_KEY), (int, float)) and math.isfinite(r[RSS_KEY])
    ]
    all_rss = [r[RSS_KEY] for r in history if isinstance(r.get(RSS_KEY), (int, float)) and math.isfinite(r[RSS_KEY])]
    nan = float("nan")
    slope = ols_slope([p[0] for p in pts], [p[1] for p in pts]) if len(pts) >= RSS_MIN_POINTS else nan
    return {
        "mem/rss_slope_mb_per_100_steps": slope * 100 if math.isfinite(slope) else nan,
        "mem/rss_peak_mb": max(all_rss) if all_rss else nan,
        "mem/rss_warm_mb": pts[0][1] if pts else nan,
    }

"""A completed run's summary figures and memory footprint."""

from __future__ import annotations

import math
from typing import Any

import torch

from prorl_bench.config import Config
from prorl_bench.run.accounting import COUNTERS, STAGES
from prorl_bench.run.curve_rules import curve_summary
from prorl_bench.run.memory import rss_trend


def summarize(
    cfg: Config,
    history: list[dict[str, Any]],
    val_rows: list[dict[str, Any]],
    objective: str,
    base_info: dict[str, Any],
    wall: float,
) -> dict[str, Any]:
    """Final and aggregate figures of a completed run (the head/tail are 10% of the steps); the
    ``curve/*`` keys are the plateau, entropy-collapse and held-out-area rules of ``curve_rules``."""
    n = len(history)
    k = max(1, n // 10)

    def mean(key: str, rows: list[dict[str, Any]]) -> float:
        vals = [r[key] for r in rows if r.get(key) is not None and not math.isnan(r[key])]
        return sum(vals) / len(vals) if vals else float("nan")

    totals = {
        key: sum(r[key] for r in history)
        for key in (*COUNTERS, *(f"time/{s}" for s in STAGES), "time/step", "perf/flops")
    }
    step_time = totals["time/step"]
    return {
        "status": "completed",
        "error": None,
        "variant": cfg.variant.name,
        "objective": objective,
        "steps_completed": n,
        "wall_time_s": wall,
        "success_rate/first10": mean("success_rate", history[:k]),
        "success_rate/last10": mean("success_rate", history[-k:]),
        "reward/first10": mean("reward/mean", history[:k]),
        "reward/last10": mean("reward/mean", history[-k:]),
        "kl/ref_mean": mean("kl/ref", history),
        "kl/ref_max": max((r["kl/ref"] for r in history if not math.isnan(r["kl/ref"])), default=float("nan")),
        "final_val": val_rows[-1] if val_rows else None,
        "totals": totals,
        "time/step_mean": step_time / n,
        "time/ref_share": totals["time/ref_logprob"] / step_time if step_time else 0.0,
        "throughput/steps_per_s": n / step_time,
        "throughput/samples_per_s": n * cfg.algo.prompts_per_step * cfg.algo.group_size / step_time,
        "perf/flops_per_s": totals["perf/flops"] / step_time,
        "base": base_info,
        **rss_trend(history, cfg.steps),
        **curve_summary(history, val_rows),
    }


def memory_figures(reference: torch.nn.Module | None, device: torch.device) -> dict[str, float]:
    """``mem/reference_mb``: bytes the reference model holds itself (0 for B; the adapter copies for
    an adapter reference); ``mem/peak_rss_mb``: the process's peak resident memory (ru_maxrss — in a
    sweep worker that ran several jobs, the peak of all of them); ``mem/cuda_max_allocated_mb`` on GPU."""
    import resource

    held = 0 if reference is None else sum(t.numel() * t.element_size() for t in reference.state_dict().values())
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    out = {"mem/reference_mb": held / 2**20, "mem/peak_rss_mb": peak_rss}
    if device.type == "cuda":
        out["mem/cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out

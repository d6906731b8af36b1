"""Per-run figures: one run directory's metrics, validation rows, events and summary -> the numbers
of ``metric_catalog.METRICS`` (nan where a figure does not apply). Pure reads of a ``RunRecord``."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from prorl_bench.config.metric_catalog import DEFAULT_THRESHOLD, DEFAULT_WINDOW, METRIC_NAMES
from prorl_bench.run.curve_rules import PASS1, PASS1_FALLBACK, curve_summary
from prorl_bench.sweeps import stats
from prorl_bench.sweeps.sweepdir import RunRecord, SweepDirError

# routing columns (printed and compared when a sweep has them): metric -> validation key
ROUTE_METRICS = {
    "route_both_success": "route/both/success",
    "route_both_hack": "route/both/hack_rate",
    "route_retain_success": "route/retain_only/success",
    "route_retain_hack": "route/retain_only/hack_rate",
}
# Invisible-Leash coverage classes (printed and compared when a sweep has them): metric -> class name
COVERAGE_METRICS = {
    "cov_both_final": "both",
    "cov_shrink_final": "base_only",
    "cov_expand_final": "trained_only",
    "cov_neither_final": "neither",
}


def column(df: pd.DataFrame, key: str) -> list[float | None]:
    if key not in df.columns:
        return []
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in df[key]]


def event_steps(run: RunRecord, name: str) -> list[float]:
    return [float(e["step"]) for e in run.events if e.get("event") == name and "step" in e]


def _summary_number(summary: dict[str, Any] | None, key: str) -> float:
    value = (summary or {}).get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return stats.NAN


def largest_k(validation: pd.DataFrame) -> int | None:
    ks = [int(c.split("@")[1]) for c in validation.columns if c.startswith("val/pass@")]
    return max(ks) if ks else None


def _validation_figures(v: pd.DataFrame, out: dict[str, float]) -> None:
    if v.empty or "step" not in v:
        return
    if "val/success_sampled" in v.columns:
        out["val_success_final"] = float(v["val/success_sampled"].iloc[-1])
    for metric, key in ROUTE_METRICS.items():
        if key not in v.columns:  # no forget adapter (plain LoRA): the policy is its own ablation
            key = key.replace("/retain_only/", "/both/")
        if key in v.columns:
            out[metric] = float(v[key].iloc[-1])
    k = largest_k(v)
    if k is None:
        return
    last = v.iloc[-1]
    for metric, name in COVERAGE_METRICS.items():  # classes at k_max vs the base (run/passk.py)
        if f"val/coverage@{k}/{name}" in v.columns:
            out[metric] = float(last[f"val/coverage@{k}/{name}"])
    out["val_pass1_final"] = float(last.get("val/pass@1", stats.NAN))
    out["val_passk_final"] = float(last[f"val/pass@{k}"])
    out["val_distinct_final"] = float(last.get("val/distinct_per_prompt", stats.NAN))
    base = v[v["step"] == 0]
    if not base.empty:
        out["val_pass1_base"] = float(base.iloc[0].get("val/pass@1", stats.NAN))
        out["val_passk_base"] = float(base.iloc[0][f"val/pass@{k}"])


# curve-rule columns (prorl_bench/run/curve_rules.py): column -> summary.json key the same function fills
CURVE_METRICS = {
    "val_pass1_auc": "curve/val_pass1_auc",
    "curve_plateaued": "curve/plateaued",
    "curve_steps_to_plateau": "curve/steps_to_plateau",
    "curve_slope_last": "curve/slope_last",
    "curve_slope_lo": "curve/slope_lo",
    "curve_slope_hi": "curve/slope_hi",
    "curve_collapse_events": "curve/collapse_events",
    "curve_first_collapse_step": "curve/first_collapse_step",
}


def _curve_figures(run: RunRecord, out: dict[str, float]) -> None:
    """The plateau, collapse and held-out-area rules, computed from the run's files with the function
    that fills summary.json's ``curve/*`` keys (so runs written before those keys existed get them too)."""
    v, m = run.validation, run.metrics
    has_pass1 = not v.empty and "step" in v and ({PASS1, PASS1_FALLBACK} & set(v.columns))
    val_rows = v.to_dict("records") if has_pass1 else []  # no held-out pass@1 logged: nan, not an error
    history = m.to_dict("records") if not m.empty and "step" in m else []
    try:
        curve = curve_summary(history, val_rows)
    except (KeyError, ValueError) as e:
        raise SweepDirError(f"{run.run_dir}: the curve rules cannot read this run's files: {e}") from e
    for metric, key in CURVE_METRICS.items():
        value = curve[key]
        out[metric] = stats.NAN if value is None else float(value)


def _event_figures(run: RunRecord, steps: list[float], window: int, out: dict[str, float]) -> None:
    """Post-event windows of one run (resets and growths): what the W steps after an event look like."""
    m = run.metrics
    events = sorted(event_steps(run, "reset") + event_steps(run, "growth"))
    if not events:
        return
    reward, success = column(m, "reward/mean"), column(m, "success_rate")
    upd, lr, kl_old = column(m, "update_norm"), column(m, "lr"), column(m, "kl/old")
    eff = [u / r if u is not None and r else None for u, r in zip(upd, lr)] if upd and lr else []

    def ratio(values: list) -> float:
        rs = []
        for e in events:
            before, after = stats.window_mean(steps, values, e - window, e), stats.window_mean(steps, values, e, e + 3)
            if math.isfinite(before) and math.isfinite(after) and before > 0:
                rs.append(after / before)
        return sum(rs) / len(rs) if rs else stats.NAN

    def mean_over_events(values: list, width: float) -> float:
        xs = stats.finite([stats.window_mean(steps, values, e, e + width) for e in events])
        return sum(xs) / len(xs) if xs else stats.NAN

    out["post_reward"] = mean_over_events(reward, window)
    out["post_success"] = mean_over_events(success, window)
    out["update_ratio"] = ratio(upd) if upd else stats.NAN
    out["eff_step_ratio"] = ratio(eff) if eff else stats.NAN
    out["kl_old_ratio"] = ratio(kl_old) if kl_old else stats.NAN
    v = [
        e["v_norm_after"] / e["v_norm_before"]
        for e in run.events
        if e.get("event") == "reset" and e.get("v_norm_before") and e.get("v_norm_after") is not None
    ]
    out["v_norm_ratio"] = sum(v) / len(v) if v else stats.NAN


def run_metrics(run: RunRecord, threshold: float = DEFAULT_THRESHOLD, window: int = DEFAULT_WINDOW) -> dict[str, float]:
    """The per-run figures of ``METRICS`` from one run's files (nan where not applicable)."""
    m = run.metrics
    out = dict.fromkeys(METRIC_NAMES, stats.NAN)
    out["steps_logged"] = float(len(m))
    summary_keys = (("wall_time_s", "wall_time_s"), ("ref_mb", "mem/reference_mb"), ("peak_rss_mb", "mem/peak_rss_mb"))
    for key, col in summary_keys:
        out[key] = _summary_number(run.summary, col)
    _validation_figures(run.validation, out)
    _curve_figures(run, out)
    if m.empty:
        return out
    if "step" not in m.columns:
        raise SweepDirError(f"{run.run_dir}: metrics.jsonl rows have no 'step' key")
    steps = [float(s) for s in m["step"]]
    reward = column(m, "reward/mean")
    step_time = column(m, "time/step")
    out["success_final"] = stats.tail_mean(column(m, "success_rate"))
    out["reward_final"] = stats.tail_mean(reward)
    out["reward_auc"] = stats.normalized_auc(steps, reward)
    hit = stats.first_crossing(steps, reward, threshold, window)
    out["steps_to_threshold"] = hit
    out["time_to_threshold_s"] = stats.time_at_step(steps, step_time, hit)
    kl = column(m, "kl/ref")
    kl_f = stats.finite(kl)
    out["kl_mean"] = sum(kl_f) / len(kl_f) if kl_f else stats.NAN
    out["kl_max"] = max(kl_f) if kl_f else stats.NAN
    out["kl_final"] = stats.tail_mean(kl)
    k1 = stats.finite(column(m, "kl/ref_k1"))
    out["kl_k1_mean"] = sum(k1) / len(k1) if k1 else stats.NAN
    for col, key, scale in (
        ("count/ref_fwd", "ref_fwd_per_step", 1.0),
        ("tokens/ref_fwd", "ref_tokens_per_step", 1.0),
        ("time/ref_logprob", "ref_ms_per_step", 1e3),
        ("time/step", "time_per_step_ms", 1e3),
    ):
        xs = stats.finite(column(m, col))
        out[key] = scale * sum(xs) / len(xs) if xs else stats.NAN
    total_step = sum(stats.finite(step_time))
    ref_time = sum(stats.finite(column(m, "time/ref_logprob")))
    out["ref_share_pct"] = 100.0 * ref_time / total_step if total_step > 0 else stats.NAN
    resets = event_steps(run, "reset")
    out["n_resets"] = float(len(resets))
    out["n_growths"] = float(len(event_steps(run, "growth")))
    kb = stats.finite(column(m, "kl/base"))
    out["kl_base_final"] = kb[-1] if kb else stats.NAN
    _event_figures(run, steps, window, out)
    return out

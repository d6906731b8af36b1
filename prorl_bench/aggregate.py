"""Sweep aggregation: per-run figures, per-group mean ± 95% CI over seeds, CSV + Markdown + figures.

Use it three ways:

* automatically at the end of a multirun (``AggregateCallback``, registered in ``conf/config.yaml``),
* ``prorl-bench-aggregate SWEEP_DIR`` (Hydra skips the callback when any job failed),
* from Python / the notebook: ``aggregate(sweep_dir)`` or the pieces ``load_sweep`` ->
  ``run_table`` -> ``group_table`` -> ``markdown_report``.

Groups are the combinations of the overrides that vary across the sweep, seed excluded. Statistics
use completed runs only; failed, preempted, incomplete and missing runs are counted per group and
listed with their error in the runs table — never dropped.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from prorl_bench import stats
from prorl_bench.sweepdir import RunRecord, Sweep, SweepDirError, group_label, load_sweep

OUT_SUBDIR = "aggregate"
SWEEP_DIR_FILE_ENV = "PRORL_BENCH_SWEEP_DIR_FILE"  # prorl-bench-sweep learns the sweep dir through it
DEFAULT_THRESHOLD = 0.5  # reward level for steps/time-to-threshold (task reward units, 0..1)
DEFAULT_WINDOW = 5  # RL steps of trailing smoothing for thresholds and recovery

# (column, heading, unit / definition) of every per-run figure, in table order.
METRICS: list[tuple[str, str, str]] = [
    ("success_final", "success (last 10%)", "training success rate, mean over the last 10% of steps"),
    ("val_success_final", "val success", "held-out sampled success rate at the last validation"),
    ("reward_final", "reward (last 10%)", "mean reward over the last 10% of steps"),
    ("reward_auc", "reward AUC", "trapezoidal area under reward/mean divided by the step span (reward units)"),
    ("steps_to_threshold", "steps to thr", "first RL step whose trailing-window mean reward >= threshold"),
    ("time_to_threshold_s", "time to thr (s)", "summed time/step up to that step, seconds"),
    ("kl_mean", "KL mean", "mean kl/ref over steps (configured estimator, nats/token)"),
    ("kl_max", "KL max", "max kl/ref over steps (nats/token)"),
    ("kl_final", "KL final", "kl/ref over the last 10% of steps (nats/token)"),
    ("kl_k1_mean", "KL k1 mean", "mean kl/ref_k1 (unbiased k1 estimate, comparable across estimators)"),
    ("ref_fwd_per_step", "ref fwd/step", "reference forward passes per RL step (count)"),
    ("ref_tokens_per_step", "ref tokens/step", "tokens through the reference per RL step"),
    ("ref_ms_per_step", "ref ms/step", "time/ref_logprob per RL step, milliseconds"),
    ("ref_share_pct", "ref share (%)", "100 * sum time/ref_logprob / sum time/step (percent of step time)"),
    ("time_per_step_ms", "ms/step", "mean time/step, milliseconds"),
    ("n_resets", "resets", "reference resets (events.jsonl event 'reset')"),
    ("n_growths", "growths", "topology growths (events.jsonl event 'growth')"),
    ("val_pass1_final", "val pass@1", "held-out pass@1 (mean success of n samples per prompt), last validation"),
    ("val_passk_final", "val pass@k", "held-out pass@k at the largest configured k (eval.ks), last validation"),
    ("val_pass1_base", "base pass@1", "held-out pass@1 of the base policy (the step-0 validation)"),
    ("val_passk_base", "base pass@k", "held-out pass@k (largest k) of the base policy"),
    ("val_distinct_final", "distinct/prompt", "distinct completions among one prompt's n samples, last validation"),
    ("kl_base_final", "KL to base", "last finite kl/base: KL of the policy to the initial base (nats/token)"),
    ("post_reward", "post-event reward", "mean reward over the W steps after each reset/growth (reward units)"),
    ("post_success", "post-event success", "mean training success over the W steps after each reset/growth"),
    ("update_ratio", "update-norm ratio", "update_norm over the 3 steps after an event / over the W steps before"),
    ("eff_step_ratio", "eff. step ratio", "(update_norm / lr) after / before an event: the effective-step change"),
    ("kl_old_ratio", "policy-move ratio", "kl/old (how far one step moves the policy) after / before an event"),
    ("v_norm_ratio", "Adam v-norm ratio", "AdamW second-moment norm after / before each reset (events.jsonl)"),
    ("ref_mb", "ref memory (MB)", "bytes the reference model holds (0 for B; a LoRA adapter reference: adapters)"),
    ("peak_rss_mb", "peak RSS (MB)", "peak resident memory of the run's process (ru_maxrss; CPU)"),
    ("wall_time_s", "wall (s)", "whole run wall time incl. warm-up load and validation, seconds"),
    ("route_both_success", "success (both)", "gradient routing: held-out task success, both adapters, last eval"),
    ("route_both_hack", "hack (both)", "gradient routing: held-out hack rate, both adapters, last eval"),
    ("route_retain_success", "success (forget ablated)", "held-out task success with the forget adapter at 0 "
     "(a policy without one: as it is)"),  # fmt: skip
    ("route_retain_hack", "hack (forget ablated)", "held-out hack rate, forget adapter at 0 (without one: as is)"),
]
# routing columns (printed and compared when a sweep has them): metric -> validation key
ROUTE_METRICS = {
    "route_both_success": "route/both/success",
    "route_both_hack": "route/both/hack_rate",
    "route_retain_success": "route/retain_only/success",
    "route_retain_hack": "route/retain_only/hack_rate",
}
# Paired comparisons against the baseline group: (metric, heading) in table order.
COMPARED = [
    ("success_final", "Δ success"),
    ("reward_auc", "Δ reward AUC"),
    ("val_pass1_final", "Δ val pass@1"),
    ("val_passk_final", "Δ val pass@k"),
]
EVENT_METRICS = ["post_reward", "post_success", "update_ratio", "eff_step_ratio", "kl_old_ratio", "v_norm_ratio"]
METRIC_NAMES = [m for m, _, _ in METRICS]
# The compact table printed at the end of a sweep (all columns are in the CSV files).
PRINTED = [
    "success_final",
    "reward_auc",
    "val_pass1_final",
    "val_passk_final",
    "val_distinct_final",
    "kl_mean",
    "ref_tokens_per_step",
    "ref_ms_per_step",
    "time_per_step_ms",
]
STATUSES = ("completed", "failed", "preempted", "incomplete", "missing")


def _col(df: pd.DataFrame, key: str) -> list[float | None]:
    if key not in df.columns:
        return []
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in df[key]]


def _event_steps(run: RunRecord, name: str) -> list[float]:
    return [float(e["step"]) for e in run.events if e.get("event") == name and "step" in e]


def _summary_number(summary: dict[str, Any] | None, key: str) -> float:
    value = (summary or {}).get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return stats.NAN


def _largest_k(validation: pd.DataFrame) -> int | None:
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
    k = _largest_k(v)
    if k is None:
        return
    last = v.iloc[-1]
    out["val_pass1_final"] = float(last.get("val/pass@1", stats.NAN))
    out["val_passk_final"] = float(last[f"val/pass@{k}"])
    out["val_distinct_final"] = float(last.get("val/distinct_per_prompt", stats.NAN))
    base = v[v["step"] == 0]
    if not base.empty:
        out["val_pass1_base"] = float(base.iloc[0].get("val/pass@1", stats.NAN))
        out["val_passk_base"] = float(base.iloc[0][f"val/pass@{k}"])


def _event_figures(run: RunRecord, steps: list[float], window: int, out: dict[str, float]) -> None:
    """Post-event windows of one run (resets and growths): what the W steps after an event look like."""
    m = run.metrics
    events = sorted(_event_steps(run, "reset") + _event_steps(run, "growth"))
    if not events:
        return
    reward, success = _col(m, "reward/mean"), _col(m, "success_rate")
    upd, lr, kl_old = _col(m, "update_norm"), _col(m, "lr"), _col(m, "kl/old")
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
    if m.empty:
        return out
    if "step" not in m.columns:
        raise SweepDirError(f"{run.run_dir}: metrics.jsonl rows have no 'step' key")
    steps = [float(s) for s in m["step"]]
    reward = _col(m, "reward/mean")
    step_time = _col(m, "time/step")
    out["success_final"] = stats.tail_mean(_col(m, "success_rate"))
    out["reward_final"] = stats.tail_mean(reward)
    out["reward_auc"] = stats.normalized_auc(steps, reward)
    hit = stats.first_crossing(steps, reward, threshold, window)
    out["steps_to_threshold"] = hit
    out["time_to_threshold_s"] = stats.time_at_step(steps, step_time, hit)
    kl = _col(m, "kl/ref")
    kl_f = stats.finite(kl)
    out["kl_mean"] = sum(kl_f) / len(kl_f) if kl_f else stats.NAN
    out["kl_max"] = max(kl_f) if kl_f else stats.NAN
    out["kl_final"] = stats.tail_mean(kl)
    k1 = stats.finite(_col(m, "kl/ref_k1"))
    out["kl_k1_mean"] = sum(k1) / len(k1) if k1 else stats.NAN
    for col, key, scale in (
        ("count/ref_fwd", "ref_fwd_per_step", 1.0),
        ("tokens/ref_fwd", "ref_tokens_per_step", 1.0),
        ("time/ref_logprob", "ref_ms_per_step", 1e3),
        ("time/step", "time_per_step_ms", 1e3),
    ):
        xs = stats.finite(_col(m, col))
        out[key] = scale * sum(xs) / len(xs) if xs else stats.NAN
    total_step = sum(stats.finite(step_time))
    ref_time = sum(stats.finite(_col(m, "time/ref_logprob")))
    out["ref_share_pct"] = 100.0 * ref_time / total_step if total_step > 0 else stats.NAN
    resets = _event_steps(run, "reset")
    out["n_resets"] = float(len(resets))
    out["n_growths"] = float(len(_event_steps(run, "growth")))
    kb = stats.finite(_col(m, "kl/base"))
    out["kl_base_final"] = kb[-1] if kb else stats.NAN
    _event_figures(run, steps, window, out)
    return out


def _first_line(text: str | None, limit: int = 160) -> str:
    if not text:
        return ""
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def run_table(sweep: Sweep, threshold: float = DEFAULT_THRESHOLD, window: int = DEFAULT_WINDOW) -> pd.DataFrame:
    """One row per run (missing and failed included): group keys, seed, status, error, figures."""
    rows = []
    for run in sweep.runs:
        row: dict[str, Any] = {"group": group_label(sweep, run)}
        row.update({k: run.overrides.get(k, "") for k in sweep.group_keys})
        row["seed"] = run.seed
        row["status"] = run.status
        row["error"] = _first_line(run.error, limit=10_000)
        row.update(run_metrics(run, threshold, window))
        row["run_dir"] = str(run.run_dir) if run.run_dir else ""
        rows.append(row)
    df = pd.DataFrame(rows)
    order = {s: i for i, s in enumerate(STATUSES)}
    df["_o"] = df["status"].map(order)
    df = df.sort_values(["group", "_o", "seed"], kind="stable").drop(columns="_o").reset_index(drop=True)
    return df


# Settings that never make two runs different experiments (where files go, threads, logging).
RUN_SPECIFIC = ("seed", "run_dir", "progress", "warmup.cache_dir", "hardware.torch_threads", "eval.batch")
RUN_SPECIFIC_PREFIXES = ("tracking.", "checkpoint.")
# What determines the base policy and the prompt stream besides the seed: runs of two groups are
# paired by seed only when these agree (then they start from one base and see the same prompts).
PAIRING_PREFIXES = ("task.", "model.", "warmup.")
PAIRING_KEYS = ("algo.prompts_per_step", "algo.group_size", "algo.temperature")


def _settings(run: RunRecord) -> dict[str, Any]:
    return {
        k: v for k, v in run.config.items() if k not in RUN_SPECIFIC and not k.startswith(RUN_SPECIFIC_PREFIXES)
    }


def split_inconsistent_groups(sweep: Sweep) -> list[str]:
    """Never pool runs whose settings differ: within one label, runs with different resolved
    settings (e.g. 100 vs 150 steps from two sweeps) become separate groups named by the differing
    keys. Returns one note per split label (empty when every group was consistent)."""
    notes = []
    by_label: dict[str, list[RunRecord]] = {}
    for run in sweep.runs:
        run.group = ""
        by_label.setdefault(group_label(sweep, run), []).append(run)
    for label, members in by_label.items():
        configured = [r for r in members if r.config]
        keys = sorted({k for r in configured for k in _settings(r)})
        differing = [k for k in keys if len({repr(_settings(r).get(k)) for r in configured}) > 1]
        if not differing:
            for r in members:
                r.group = label
            continue
        for r in members:
            if r.config:
                tag = ", ".join(f"{k}={_settings(r).get(k)}" for k in differing[:3])
                r.group = f"{label} [{tag}]"
            else:
                r.group = label
        notes.append(f"group {label!r} split: its runs differ in {', '.join(differing)}")
    return notes


def pair_key(run: RunRecord) -> tuple[str, str]:
    """(seed, everything that fixes the base and the prompt stream): equal keys pair."""
    cfg = run.config
    shared = {k: v for k, v in cfg.items() if k.startswith(PAIRING_PREFIXES) or k in PAIRING_KEYS}
    shared.pop("warmup.cache_dir", None)
    if not any(k.startswith("task.") for k in shared):
        # No resolved task settings (config_resolved.yaml absent or foreign): that the runs share a
        # base and a prompt stream cannot be checked, so this run pairs with nothing (Welch).
        return run.seed, f"unverifiable:{run.run_dir}"
    return run.seed, repr(sorted(shared.items()))


def default_baseline(groups: Sequence[str]) -> str | None:
    """A1 (the reference-model baseline) when present, else keep (the optimizer-state baseline),
    else the first group."""
    for name in ("A1", "keep"):
        if name in groups:
            return name
    return groups[0] if groups else None


def compare_groups(
    sweep: Sweep,
    runs: pd.DataFrame,
    baseline: str | None,
    window: int = DEFAULT_WINDOW,
    compared: Sequence[tuple[str, str]] = COMPARED,
) -> pd.DataFrame:
    """Per (group != baseline) x metric of ``COMPARED`` (and the post-event windows relative to the
    same window of the paired baseline run): difference, CI, p, Holm-adjusted p (across the whole
    table), n. Pairs by ``pair_key`` (seeds on one side only are left out of the pairs); a group whose
    runs do not share the baseline's base/prompt settings, or that holds a seed twice, is compared
    unpaired (Welch) over all its completed runs."""
    ok = runs[runs["status"] == "completed"]
    if baseline is None or baseline not in set(ok["group"]):
        return pd.DataFrame()
    by_dir = {str(r.run_dir): r for r in sweep.runs if r.run_dir}
    rows_of: dict[str, list[tuple[tuple[str, str], dict]]] = {}
    for _, row in ok.iterrows():
        run = by_dir.get(row["run_dir"])
        if run is not None:
            rows_of.setdefault(row["group"], []).append((pair_key(run), row.to_dict()))
    base_rows = rows_of.get(baseline, [])
    base = dict(base_rows)
    out = []
    for group, member_rows in rows_of.items():
        if group == baseline:
            continue
        members = dict(member_rows)
        shared = [k for k in members if k in base]
        # Pair only when every run of both groups fixes the same base and prompt stream (one settings
        # key) and no seed occurs twice (two pooled sweeps with the same seeds: a dict would silently
        # keep one of them). Seeds present on one side only (a failed run) are left out of the pairs:
        # n counts the pairs actually used.
        paired = (
            len(shared) > 0
            and len(members) == len(member_rows)
            and len(base) == len(base_rows)
            and len({k[1] for k in members} | {k[1] for k in base}) == 1
        )
        for metric, _ in compared:
            if paired:
                c = stats.paired_comparison([members[k][metric] for k in shared], [base[k][metric] for k in shared])
            else:
                c = stats.welch_comparison([r[metric] for _, r in member_rows], [r[metric] for _, r in base_rows])
            out.append({"group": group, "metric": metric, **c.__dict__})
        if paired:
            for metric, col in (("post_reward", "reward/mean"), ("post_success", "success_rate")):
                pairs = [(by_dir[members[k]["run_dir"]], by_dir[base[k]["run_dir"]]) for k in shared]
                diffs = [_event_window_diff(run, ref, col, window) for run, ref in pairs]
                if stats.finite(diffs):
                    c = stats.paired_comparison(diffs, [0.0] * len(diffs))
                    out.append({"group": group, "metric": f"{metric}_vs_baseline", **c.__dict__})
    table = pd.DataFrame(out)
    if not table.empty:
        table["p_holm"] = stats.holm(list(table["p"]))
    return table


def _event_window_diff(run: RunRecord, ref: RunRecord, col: str, w: int = DEFAULT_WINDOW) -> float:
    """Mean over the run's resets/growths of [mean of ``col`` over steps (e, e+w] in the run minus the
    same steps of its paired baseline run]; nan when the run has no events."""
    if run.metrics.empty or ref.metrics.empty:
        return stats.NAN
    events = _event_steps(run, "reset") + _event_steps(run, "growth")
    rs, bs = [float(x) for x in run.metrics["step"]], [float(x) for x in ref.metrics["step"]]
    mine, theirs = _col(run.metrics, col), _col(ref.metrics, col)
    d = stats.finite([stats.window_mean(rs, mine, e, e + w) - stats.window_mean(bs, theirs, e, e + w) for e in events])
    return sum(d) / len(d) if d else stats.NAN


def group_table(runs: pd.DataFrame, group_keys: Sequence[str]) -> pd.DataFrame:
    """Per group: run counts by status and, over completed runs, mean / 95% CI half-width / n per figure."""
    out = []
    for group, g in runs.groupby("group", sort=False):
        row: dict[str, Any] = {"group": group}
        row.update({k: g[k].iloc[0] for k in group_keys})
        row["n_runs"] = len(g)
        for s in STATUSES:
            row[f"n_{s}"] = int((g["status"] == s).sum())
        ok = g[g["status"] == "completed"]
        for m in METRIC_NAMES:
            mean, ci, n = stats.mean_ci(list(ok[m]) if m in ok else [])
            row[f"{m}_mean"], row[f"{m}_ci95"], row[f"{m}_n"] = mean, ci, n
        out.append(row)
    return pd.DataFrame(out)


# --------------------------------------------------------------------------- markdown


def fmt_value(x: float) -> str:
    """About 3 significant digits without exponents for everyday magnitudes; ``–`` for nan."""
    if x is None or not math.isfinite(x):
        return "–"
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    if a >= 1e-3:
        return f"{x:.3f}"
    return f"{x:.1e}"


def fmt_mean_ci(mean: float, ci: float, n: int) -> str:
    """``0.512 ± 0.034`` (95% CI half-width); just the mean for n = 1; ``–`` when nothing to show."""
    if n == 0:
        return "–"
    if n == 1 or not math.isfinite(ci):
        return fmt_value(mean)
    if ci <= 1e-9 * max(1.0, abs(mean)):
        ci = 0.0  # identical seeds up to float rounding
    return f"{fmt_value(mean)} ± {fmt_value(ci)}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table ('|' in cells escaped)."""

    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _runs_cell(row: pd.Series) -> str:
    parts = [f"{row['n_completed']}/{row['n_runs']} ok"]
    parts += [f"{row[f'n_{s}']} {s}" for s in STATUSES[1:] if row[f"n_{s}"]]
    return ", ".join(parts)


def fmt_comparison(c: pd.Series) -> str:
    """``+0.012 [-0.003, 0.027] p=0.25 (Holm 1) (n=3)``; ``unpaired`` marks Welch."""
    if not c["n"] or not math.isfinite(c["diff"]):
        return "–"
    sign = "+" if c["diff"] > 0 else ""
    ci = "" if not math.isfinite(c["lo"]) else f" [{fmt_value(c['lo'])}, {fmt_value(c['hi'])}]"
    p = "" if not math.isfinite(c["p"]) else f" p={c['p']:.2g}"
    if math.isfinite(c["p_holm"]):
        p += f" (Holm {c['p_holm']:.2g})"
    kind = "" if c["paired"] else ", unpaired"
    return f"{sign}{fmt_value(c['diff'])}{ci}{p} (n={int(c['n'])}{kind})"


def comparison_markdown(
    comparisons: pd.DataFrame,
    baseline: str | None,
    k: int | None,
    window: int = DEFAULT_WINDOW,
    compared: Sequence[tuple[str, str]] = COMPARED,
) -> str:
    if comparisons.empty:
        return ""
    heads = dict(compared) | {
        "post_reward_vs_baseline": "Δ post-event reward",
        "post_success_vs_baseline": "Δ post-event success",
    }
    metrics = [m for m in heads if m in set(comparisons["metric"])]
    body = []
    for group, g in comparisons.groupby("group", sort=False):
        cells = {r["metric"]: fmt_comparison(r) for _, r in g.iterrows()}
        body.append([group] + [cells.get(m, "–") for m in metrics])
    header = ["group"] + [heads[m].replace("pass@k", f"pass@{k}" if k else "pass@k") for m in metrics]
    return "\n".join(
        [
            f"### Paired differences vs baseline `{baseline}`",
            "",
            "Cells: group − baseline, mean of per-seed differences [95% percentile-bootstrap CI], exact "
            "sign-flip p and its Holm adjustment across every cell of this table, n pairs. "
            "Runs pair by seed when they share the base policy and prompt stream; otherwise `unpaired` "
            "(Welch t interval and p). Post-event: the "
            f"W={window} steps after each reset/growth minus the same steps of the paired baseline run.",
            "",
            markdown_table(header, body),
            "",
        ]
    )


def event_markdown(groups: pd.DataFrame, window: int = DEFAULT_WINDOW) -> str:
    """Post-event diagnostics per group (only groups with events)."""
    heading = {m: h for m, h, _ in METRICS}
    # "> 0", not truthiness: a group with no completed run has NaN counts, and NaN is truthy (a row of dashes)
    rows = [g for _, g in groups.iterrows() if g.get("n_resets_mean", 0) > 0 or g.get("n_growths_mean", 0) > 0]
    if not rows:
        return ""
    body = [
        [g["group"]] + [fmt_mean_ci(g[f"{m}_mean"], g[f"{m}_ci95"], int(g[f"{m}_n"])) for m in EVENT_METRICS]
        for g in rows
    ]
    return "\n".join(
        [
            "### After resets and growths",
            "",
            f"Per run, averaged over its events (W={window} steps); cells mean ± 95% t-CI over seeds. "
            "A ratio > 1 means bigger steps after the event than before; Adam's v-norm ratio < 1 with "
            "`step: keep` is the bias-correction hazard (a larger effective step).",
            "",
            markdown_table(["group"] + [heading[m] for m in EVENT_METRICS], body),
            "",
        ]
    )


def markdown_report(
    sweep: Sweep,
    runs: pd.DataFrame,
    groups: pd.DataFrame,
    threshold: float = DEFAULT_THRESHOLD,
    window: int = DEFAULT_WINDOW,
    columns: Sequence[str] = PRINTED,
    comparisons: pd.DataFrame | None = None,
    baseline: str | None = None,
    notes: Sequence[str] = (),
    compared: Sequence[tuple[str, str]] = COMPARED,
) -> str:
    """The comparison table (mean ± 95% CI over completed seeds, with n), the paired differences
    against the baseline group, post-event diagnostics, and the list of all runs."""
    k = max((_largest_k(r.validation) or 0 for r in sweep.runs), default=0) or None
    heading = {m: h.replace("pass@k", f"pass@{k}") if k else h for m, h, _ in METRICS}
    header = ["group", "runs"] + [heading[c] for c in columns]
    body = []
    for _, g in groups.iterrows():
        cells = [g["group"], _runs_cell(g)]
        for c in columns:
            cell = fmt_mean_ci(g[f"{c}_mean"], g[f"{c}_ci95"], int(g[f"{c}_n"]))
            if c == "steps_to_threshold" and g["n_completed"]:
                cell += f" ({int(g[f'{c}_n'])}/{g['n_completed']} reached)"
            cells.append(cell)
        body.append(cells)
    fixed = ", ".join(f"{k}={v}" for k, v in sweep.fixed.items()) or "none"
    n_bad = int((runs["status"] != "completed").sum())
    parts = [
        f"## Sweep {sweep.sweep_dir}",
        "",
        f"Grouped by: {', '.join(sweep.group_keys) or '(nothing varies but the seed)'}; fixed: {fixed}.",
        f"Cells: mean ± 95% CI half-width (Student t, over completed seeds; n = ok runs). "
        f"Threshold: trailing {window}-step mean reward ≥ {threshold}.",
        "",
        markdown_table(header, body),
        "",
        *[f"Note: {n}." for n in notes],
        comparison_markdown(
            comparisons if comparisons is not None else pd.DataFrame(), baseline, k, window, compared
        ),
        event_markdown(groups, window),
        f"### Runs ({len(runs)} total, {n_bad} not completed)",
        "",
    ]
    run_rows = [
        [
            r["group"],
            r["seed"],
            r["status"],
            int(r["steps_logged"]),
            fmt_value(r["success_final"]),
            fmt_value(r["time_per_step_ms"]),
            _first_line(r["error"]),
        ]
        for _, r in runs.iterrows()
    ]
    run_header = ["group", "seed", "status", "steps", "success (last 10%)", "ms/step", "error"]
    parts.append(markdown_table(run_header, run_rows))
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------- entry points


@dataclass
class AggregateResult:
    sweep: Sweep
    runs: pd.DataFrame
    groups: pd.DataFrame
    markdown: str
    out_dir: Path
    figures: list[Path]


def load_sweeps(sweep_dirs: Sequence[str | Path]) -> Sweep:
    """One sweep, or several merged into one (groups recomputed over all runs; runs whose settings
    differ under one label are split, never pooled)."""
    sweeps = [load_sweep(d) for d in sweep_dirs]
    if len(sweeps) == 1:
        return sweeps[0]
    from prorl_bench.sweepdir import _group_keys

    runs = [r for sw in sweeps for r in sw.runs]
    group_keys, fixed = _group_keys(runs)
    return Sweep(sweeps[0].sweep_dir, runs, group_keys, fixed)


def aggregate(
    sweep_dir: str | Path | Sequence[str | Path],
    out_dir: str | Path | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    window: int = DEFAULT_WINDOW,
    figures: bool = True,
    baseline: str | None = None,
    strict_baseline: bool = True,
) -> AggregateResult:
    """Load a sweep (or several), write ``runs.csv``, ``groups.csv``, ``comparisons.csv``,
    ``table.md`` and the figures into ``out_dir`` (default ``SWEEP_DIR/aggregate`` of the first),
    and return everything. ``baseline``: the group others are compared with (default: A1, keep, or
    the first group)."""
    dirs = [sweep_dir] if isinstance(sweep_dir, (str, Path)) else list(sweep_dir)
    sweep = load_sweeps(dirs)
    notes = split_inconsistent_groups(sweep)
    runs = run_table(sweep, threshold, window)
    groups = group_table(runs, sweep.group_keys)
    names = list(groups["group"])
    if baseline is not None and baseline not in names:
        if strict_baseline:
            raise SweepDirError(f"--baseline {baseline!r} is not a group of this sweep; groups: {names}")
        notes.append(f"baseline {baseline!r} (from the grid's config) is not a group here; using the default")
        baseline = None
    baseline = baseline or default_baseline(names)
    routed = [m for m in ROUTE_METRICS if m in runs and runs[m].notna().any()]
    compared = COMPARED + [(m, "Δ " + dict((x, h) for x, h, _ in METRICS)[m]) for m in routed]
    comparisons = compare_groups(sweep, runs, baseline, window, compared)
    md = markdown_report(
        sweep, runs, groups, threshold, window, columns=PRINTED + routed, comparisons=comparisons,
        baseline=baseline, notes=notes, compared=compared,
    )  # fmt: skip
    out = Path(out_dir) if out_dir else sweep.sweep_dir / OUT_SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / "runs.csv", index=False)
    groups.to_csv(out / "groups.csv", index=False)
    comparisons.to_csv(out / "comparisons.csv", index=False)
    (out / "table.md").write_text(md)
    paths: list[Path] = []
    if figures:
        from prorl_bench.plots import write_figures  # seaborn/matplotlib only when drawing

        paths = write_figures(sweep, runs, out, window=window, baseline=baseline)
    return AggregateResult(sweep, runs, groups, md, out, paths)


def print_result(res: AggregateResult, stream=None) -> None:
    stream = stream or sys.stdout
    print(res.markdown, file=stream)
    print(f"[prorl-bench-aggregate] tables: {res.out_dir}/{{runs.csv,groups.csv,table.md}}", file=stream)
    for p in res.figures:
        print(f"[prorl-bench-aggregate] figure: {p}", file=stream)
    stream.flush()


class AggregateCallback(Callback):
    """Hydra callback: note the sweep dir at multirun start, aggregate and print at multirun end.

    Hydra does not call ``on_multirun_end`` when a job failed; ``prorl-bench-sweep`` then runs the
    aggregation itself, using the directory recorded here.
    """

    def __init__(
        self,
        threshold: float = DEFAULT_THRESHOLD,
        window: int = DEFAULT_WINDOW,
        figures: bool = True,
        baseline: str | None = None,
    ):
        self.threshold, self.window, self.figures, self.baseline = threshold, window, figures, baseline

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from prorl_bench.guards import stop_sweep_on_signals

        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        stop_sweep_on_signals(sweep_dir)  # SIGTERM/SIGINT stop the sweep cleanly, table included
        target = os.environ.get(SWEEP_DIR_FILE_ENV)
        if target:
            Path(target).write_text(str(sweep_dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        res = aggregate(
            config.hydra.sweep.dir,
            threshold=self.threshold,
            window=self.window,
            figures=self.figures,
            baseline=self.baseline,
            strict_baseline=False,  # a grid narrowed on the command line may not contain it
        )
        print_result(res)


def main(argv: Sequence[str] | None = None) -> int:
    """``prorl-bench-aggregate SWEEP_DIR [SWEEP_DIR ...] [--baseline GROUP]``: tables and figures."""
    p = argparse.ArgumentParser(prog="prorl-bench-aggregate", description=__doc__.splitlines()[0])
    p.add_argument(
        "sweep_dir", type=Path, nargs="+",
        help="Hydra multirun directories, e.g. outputs/sweeps/ablation/<date> (several: compared together)",
    )  # fmt: skip
    p.add_argument("--baseline", default=None, help="group to compare against (default: A1, keep, or the first)")
    p.add_argument("--out", type=Path, default=None, help=f"output directory (default SWEEP_DIR/{OUT_SUBDIR})")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="reward threshold (reward units)")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="smoothing window, RL steps")
    p.add_argument("--no-figures", action="store_true", help="tables only")
    args = p.parse_args(argv)
    try:
        res = aggregate(
            args.sweep_dir, args.out, args.threshold, args.window, figures=not args.no_figures, baseline=args.baseline
        )
    except SweepDirError as e:
        print(f"prorl-bench-aggregate: {e}", file=sys.stderr)
        return 2
    print_result(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

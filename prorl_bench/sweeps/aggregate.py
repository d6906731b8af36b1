"""Sweep aggregation: per-run figures, per-group mean ± 95% CI over seeds, CSV + Markdown + figures.

Use it three ways:

* automatically at the end of a multirun (``callback.AggregateCallback``, registered in ``conf/config.yaml``),
* ``prorl-bench-aggregate SWEEP_DIR`` (Hydra skips the callback when any job failed),
* from Python / the notebook: ``aggregate(sweep_dir)`` or the pieces ``load_sweep`` ->
  ``run_table`` -> ``group_table`` -> ``markdown_report``.

Groups are the combinations of the overrides that vary across the sweep, seed excluded. Statistics
use completed runs only; failed, preempted, incomplete and missing runs are counted per group and
listed with their error in the runs table — never dropped.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from prorl_bench.registry import ConfigError
from prorl_bench.sweeps import stats
from prorl_bench.sweeps.metric_catalog import DEFAULT_THRESHOLD, DEFAULT_WINDOW, METRIC_NAMES, METRICS
from prorl_bench.sweeps.seed_plan import seed_plan, seed_plan_markdown
from prorl_bench.sweeps.study import REQUIRED_BLOCKS, Endpoint, StudyConfig, study_from_dict
from prorl_bench.sweeps.sweepdir import (
    RunRecord,
    Sweep,
    SweepDirError,
    base_per_seed,
    group_label,
    load_sweep,
    pair_key,
)

OUT_SUBDIR = "aggregate"

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
    """One row per run (missing and failed included): group keys, seed, seed block, source sweep
    (1-based, as the heading lists the directories), status, error, figures."""
    rows = []
    origin = sweep.origin if isinstance(sweep, Sweeps) else {}
    for run in sweep.runs:
        row: dict[str, Any] = {"group": group_label(sweep, run)}
        row.update({k: run.overrides.get(k, "") for k in sweep.group_keys})
        row["seed"] = run.seed
        row["block"] = run_block(run)
        row["sweep"] = origin.get(id(run), 0) + 1
        row["status"] = run.status
        row["error"] = _first_line(run.error, limit=10_000)
        row.update(run_metrics(run, threshold, window))
        row["run_dir"] = str(run.run_dir) if run.run_dir else ""
        rows.append(row)
    df = pd.DataFrame(rows)
    df = _fill_blocks(df)
    order = {s: i for i, s in enumerate(STATUSES)}
    df["_o"] = df["status"].map(order)
    df["_b"] = df["block"].map(_block_rank)
    df["_s"] = pd.to_numeric(df["seed"], errors="coerce")  # 2 before 10 (seeds may come as text)
    df = df.sort_values(["_b", "group", "_o", "_s", "seed"], kind="stable").drop(columns=["_o", "_b", "_s"])
    return df.reset_index(drop=True)


def _block_rank(block: str) -> tuple[int, str]:
    return (REQUIRED_BLOCKS.index(block) if block in REQUIRED_BLOCKS else len(REQUIRED_BLOCKS), block)


def _fill_blocks(df: pd.DataFrame) -> pd.DataFrame:
    """Runs that never wrote a config (missing, died at start-up) take their sweep's block."""
    for _, g in df.groupby("sweep"):
        known = [b for b in g["block"] if b != NO_BLOCK]
        if known and len(set(known)) == 1:
            df.loc[g.index, "block"] = known[0]
    return df


# Settings that never make two runs different experiments (where files go, threads, logging; the study
# node: which seed block a run belongs to is handled as the block, not as a setting).
RUN_SPECIFIC = ("seed", "run_dir", "progress", "warmup.cache_dir", "hardware.torch_threads", "eval.batch")
RUN_SPECIFIC_PREFIXES = ("tracking.", "checkpoint.", "study.")


@dataclass
class Sweeps(Sweep):
    """One or several sweep directories read together. ``dirs``: every directory, in the order given;
    ``origin``: id(run) -> index into ``dirs``; ``label``: id(run) -> its group label *within its own
    sweep* (so a key that only another sweep varies never shows up empty in a label)."""

    dirs: list[Path] = field(default_factory=list)
    origin: dict[int, int] = field(default_factory=dict)
    label: dict[int, str] = field(default_factory=dict)

    def sources(self, runs: Sequence[RunRecord]) -> str:
        """``[1]``, ``[1+2]``: which directories these runs come from (1-based, as the heading lists them)."""
        return "[" + "+".join(str(i + 1) for i in sorted({self.origin[id(r)] for r in runs})) + "]"


def _settings(run: RunRecord) -> dict[str, Any]:
    return {k: v for k, v in run.config.items() if k not in RUN_SPECIFIC and not k.startswith(RUN_SPECIFIC_PREFIXES)}


def split_inconsistent_groups(sweep: Sweep) -> list[str]:
    """Label every run by its own sweep's varied overrides, and never pool runs whose settings differ:
    within one label, runs with different resolved settings (e.g. 100 vs 150 steps from two sweeps)
    become separate groups named by the differing keys. Returns one note per split label."""
    notes = []
    by_label: dict[str, list[RunRecord]] = {}
    per_seed = base_per_seed(sweep.runs)
    own = sweep.label if isinstance(sweep, Sweeps) else {}
    for run in sweep.runs:
        run.group = own.get(id(run), "")
        by_label.setdefault(group_label(sweep, run), []).append(run)
    for label, members in by_label.items():
        configured = [r for r in members if r.config]
        keys = sorted({k for r in configured for k in _settings(r)})
        # a base per seed ('warmup.seed=${seed}') varies as the seed does: one group per arm, not per base
        keys = [k for k in keys if not (per_seed and k == "warmup.seed")]
        differing = [k for k in keys if len({repr(_settings(r).get(k)) for r in configured}) > 1]
        for r in members:
            r.group = label
            if differing and r.config:
                r.group = f"{label} [{', '.join(f'{k}={_settings(r).get(k)}' for k in differing[:3])}]"
        if differing:
            notes.append(f"group {label!r} split: its runs differ in {', '.join(differing)}")
    return notes


def default_baseline(groups: Sequence[str]) -> str | None:
    """A1 (the reference-model baseline) when present, else keep (the optimizer-state baseline),
    else the first group."""
    for name in ("A1", "keep"):
        if name in groups:
            return name
    return groups[0] if groups else None


# --------------------------------------------------------------------------- studies and blocks

NO_BLOCK = ""  # runs of a grid that declares no study


def run_block(run: RunRecord) -> str:
    """The seed block a run belongs to (``study.block`` of its resolved config or its overrides)."""
    if run.config.get("study.question"):
        return str(run.config.get("study.block", "explore"))
    return run.overrides.get("study.block", NO_BLOCK)


def _study_node(run: RunRecord) -> dict[str, Any] | None:
    """The run's ``study:`` node rebuilt from its flattened resolved config (None: no study)."""
    flat = {k[len("study.") :]: v for k, v in run.config.items() if k.startswith("study.")}
    if not flat.get("question"):
        return None
    node: dict[str, Any] = {"blocks": {}}
    for key, value in flat.items():
        if key.startswith("blocks."):
            node["blocks"][key.split(".", 1)[1]] = str(value)
        elif key == "primary":
            node[key] = json.loads(value) if isinstance(value, str) else value
        else:
            node[key] = value
    return node


def read_study(sweep: Sweep) -> tuple[StudyConfig | None, list[str]]:
    """The study the runs declare (one for all of them, blocks aside), or None with a note saying why."""
    nodes = {}
    for run in sweep.runs:
        node = _study_node(run)
        if node is not None:
            node = {k: v for k, v in node.items() if k != "block"}
            nodes.setdefault(json.dumps(node, sort_keys=True), run)
    if not nodes:
        return None, []
    if len(nodes) > 1 or any(r.config and _study_node(r) is None for r in sweep.runs):
        return None, ["the runs do not declare one study (different `study:` nodes, or runs without one): "
                      "every comparison is descriptive"]  # fmt: skip
    text, run = next(iter(nodes.items()))
    try:
        return study_from_dict({**json.loads(text), "block": run_block(run)}), []
    except ConfigError as e:
        raise SweepDirError(f"{run.run_dir}: config_resolved.yaml: {e}") from e


def _diff_signature(values: Sequence[float | None], base: Sequence[float | None]) -> tuple:
    """What a test sees: the per-pair differences (paired) or both samples (unpaired), rounded to 1e-12
    so two columns that are the same numbers (success and reward under exact rewards) compare equal."""
    return tuple(round(float(x), 12) if x is not None and math.isfinite(float(x)) else None for x in [*values, *base])


def compare_groups(
    sweep: Sweep,
    runs: pd.DataFrame,
    baseline: str | None,
    window: int = DEFAULT_WINDOW,
    compared: Sequence[tuple[str, str]] = COMPARED,
    study: StudyConfig | None = None,
) -> pd.DataFrame:
    """Per (group != baseline) x metric of ``compared`` (and the post-event windows relative to the
    same window of the paired baseline run): difference, t interval, sign-flip p, n, and its family.

    ``family``: ``primary`` for a study's primary endpoints (Holm-adjusted p and TOST p within the
    primary cells of this table, a verdict); ``descriptive`` for every other cell (raw p, no verdict);
    ``duplicate`` when a cell is the same test as an earlier one of its group (identical numbers,
    e.g. post-event reward and success under exact rewards): ``duplicate_of`` names it. Pairs by
    ``pair_key`` (seeds on one side only are left out of the pairs); a group whose runs do not share
    the baseline's base/prompt settings, or that holds a seed twice, is compared unpaired (Welch)."""
    ok = runs[runs["status"] == "completed"]
    if baseline is None or baseline not in set(ok["group"]):
        return pd.DataFrame()
    primary = {e.metric: e for e in study.primary} if study is not None else {}
    metrics = [m for m in primary if m not in dict(compared)] + [m for m, _ in compared]
    metrics.sort(key=lambda m: m not in primary)  # primaries first: never a duplicate of a descriptive cell
    by_dir = {str(r.run_dir): r for r in sweep.runs if r.run_dir}
    rows_of: dict[str, list[tuple[tuple[str, str], dict]]] = {}
    per_seed = base_per_seed(sweep.runs)
    for _, row in ok.iterrows():
        run = by_dir.get(row["run_dir"])
        if run is not None:
            rows_of.setdefault(row["group"], []).append((pair_key(run, per_seed), row.to_dict()))
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
        cells: list[tuple[str, list, list, bool]] = []
        for metric in metrics:
            if paired:
                cells.append((metric, [members[k][metric] for k in shared], [base[k][metric] for k in shared], True))
            else:
                cells.append((metric, [r[metric] for _, r in member_rows], [r[metric] for _, r in base_rows], False))
        if paired:
            for metric, col in (("post_reward", "reward/mean"), ("post_success", "success_rate")):
                pairs = [(by_dir[members[k]["run_dir"]], by_dir[base[k]["run_dir"]]) for k in shared]
                diffs = [_event_window_diff(run, ref, col, window) for run, ref in pairs]
                if stats.finite(diffs):
                    cells.append((f"{metric}_vs_baseline", diffs, [0.0] * len(diffs), True))
        seen: dict[tuple, str] = {}
        for metric, values, base_values, is_paired in cells:
            endpoint = primary.get(metric)
            margin = endpoint.margin if endpoint is not None and endpoint.margin is not None else stats.NAN
            if is_paired:
                c = stats.paired_comparison(values, base_values, margin=margin)
                sig = _diff_signature([a - b if a is not None and b is not None else None
                                       for a, b in zip(values, base_values)], [])  # fmt: skip
            else:
                c = stats.welch_comparison(values, base_values)
                sig = _diff_signature(values, base_values)
            family = "primary" if endpoint is not None else "descriptive"
            duplicate_of = seen.get(sig, "") if c.n else ""
            if duplicate_of and family != "primary":
                family = "duplicate"
            seen.setdefault(sig, metric)
            out.append({"group": group, "metric": metric, **c.__dict__, "family": family, "duplicate_of": duplicate_of})
    table = pd.DataFrame(out)
    if not table.empty:
        _adjust_and_judge(table, primary)
    return table


def _adjust_and_judge(table: pd.DataFrame, primary: dict[str, Endpoint]) -> None:
    """Holm over the primary cells only (difference p and TOST p, each its own family), then a verdict
    per primary cell; descriptive and duplicate cells keep nan adjusted p and no verdict."""
    is_primary = table["family"] == "primary"
    for col, adj in (("p", "p_holm"), ("p_equiv", "p_equiv_holm")):
        table[adj] = stats.NAN
        table.loc[is_primary, adj] = stats.holm(list(table.loc[is_primary, col]))
    table["verdict"] = ""
    table["direction"] = ""
    for i in table.index[is_primary]:
        table.at[i, "verdict"] = stats.verdict(table.at[i, "p_holm"], table.at[i, "p_equiv_holm"])
        table.at[i, "direction"] = primary[table.at[i, "metric"]].direction.value


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
    """Per (seed block, group): run counts by status and, over completed runs, mean / 95% CI
    half-width / n per figure; ``sweeps``: which directories its runs come from (``1``, ``1+2``)."""
    out = []
    blocks = runs["block"] if "block" in runs else pd.Series(NO_BLOCK, index=runs.index)
    for (block, group), g in runs.groupby([blocks, "group"], sort=False):
        row: dict[str, Any] = {"group": group}
        row.update({k: g[k].iloc[0] for k in group_keys})
        row["block"] = block
        row["sweeps"] = "+".join(str(i) for i in sorted(set(g["sweep"]))) if "sweep" in g else "1"
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


def _sources_cell(row: pd.Series) -> str:
    return f"[{row.get('sweeps', '1')}]"


def _verdict_text(c: pd.Series) -> str:
    """``different (worse)``, ``equivalent within ±0.03``, ``undecided``; direction from the endpoint."""
    v = c.get("verdict", "")
    margin = c.get("margin", stats.NAN)
    within = f"within ±{fmt_value(margin)}" if math.isfinite(margin) else ""
    if v == stats.DIFFERENT:
        better = (c["diff"] > 0) == (c.get("direction") == "higher")
        text = f"different ({'better' if better else 'worse'})"
        if math.isfinite(c.get("p_equiv_holm", stats.NAN)) and c["p_equiv_holm"] < stats.ALPHA:
            text += f", {within}"
        return text
    if v == stats.EQUIVALENT:
        return f"equivalent {within}"
    return v


def fmt_comparison(c: pd.Series, heads: dict[str, str] | None = None) -> str:
    """``+0.012 [-0.003, 0.027] p=0.25 (Holm 1) (n=3) → undecided`` for a primary cell,
    ``... p=0.25 (n=3, descriptive)`` for the others; ``unpaired`` marks Welch; a duplicate names
    the cell it repeats."""
    family = c.get("family", "descriptive")
    if family == "duplicate":
        return f"same test as {(heads or {}).get(c['duplicate_of'], c['duplicate_of'])}"
    if not c["n"] or not math.isfinite(c["diff"]):
        return "–"
    sign = "+" if c["diff"] > 0 else ""
    ci = "" if not math.isfinite(c["lo"]) else f" [{fmt_value(c['lo'])}, {fmt_value(c['hi'])}]"
    p = "" if not math.isfinite(c["p"]) else f" p={c['p']:.2g}"
    if math.isfinite(c.get("p_holm", stats.NAN)):
        p += f" (Holm {c['p_holm']:.2g})"
    kind = "" if c["paired"] else ", unpaired"
    if family == "primary":
        return f"{sign}{fmt_value(c['diff'])}{ci}{p} (n={int(c['n'])}{kind}) → {_verdict_text(c)}"
    return f"{sign}{fmt_value(c['diff'])}{ci}{p} (n={int(c['n'])}{kind}, descriptive)"


def _comparison_heads(compared: Sequence[tuple[str, str]], k: int | None) -> dict[str, str]:
    heading = {m: h for m, h, _ in METRICS}
    heads = {m: "Δ " + heading[m] for m in METRIC_NAMES} | dict(compared)
    heads |= {"post_reward_vs_baseline": "Δ post-event reward", "post_success_vs_baseline": "Δ post-event success"}
    return {m: h.replace("pass@k", f"pass@{k}" if k else "pass@k") for m, h in heads.items()}


def comparison_markdown(
    comparisons: pd.DataFrame,
    baseline: str | None,
    k: int | None,
    window: int = DEFAULT_WINDOW,
    compared: Sequence[tuple[str, str]] = COMPARED,
    baseline_source: str = "",
    study: StudyConfig | None = None,
) -> str:
    if comparisons.empty:
        return ""
    heads = _comparison_heads(compared, k)
    metrics = list(dict.fromkeys(m for m in comparisons["metric"] if m in heads))
    body = []
    for group, g in comparisons.groupby("group", sort=False):
        cells = {r["metric"]: fmt_comparison(r, heads) for _, r in g.iterrows()}
        body.append([group] + [cells.get(m, "–") for m in metrics])
    family = (
        f"Primary cells (the study's endpoints {', '.join(e.metric for e in study.primary)} × arms) carry a Holm "
        "adjustment across the primary cells of this table and a verdict; every other cell is descriptive "
        "(unadjusted p, no conclusion)."
        if study is not None
        else "No study applies to these comparisons (none declared, or see the notes): every cell is "
        "descriptive (unadjusted p, no conclusion; docs/studies.md)."
    )
    return "\n".join(
        [
            f"### Paired differences vs baseline `{baseline}`{baseline_source}",
            "",
            "Cells: group − baseline, mean of per-seed differences [95% Student t interval], exact "
            f"sign-flip p, n pairs. {family} Runs pair by seed when they share the base policy and prompt "
            "stream; otherwise `unpaired` (Welch t interval and p). A cell with the same numbers as an "
            "earlier one is the same test and says so. Post-event: the "
            f"W={window} steps after each reset/growth minus the same steps of the paired baseline run.",
            "",
            markdown_table(["group"] + [heads[m] for m in metrics], body),
            "",
        ]
    )


def _seeds_text(study: StudyConfig, block: str) -> str:
    seeds = study.seeds(block)
    contiguous = seeds == list(range(seeds[0], seeds[0] + len(seeds)))
    return f"seeds {seeds[0]}–{seeds[-1]}" if contiguous and len(seeds) > 2 else f"seeds {', '.join(map(str, seeds))}"


def study_markdown(study: StudyConfig, comparisons: pd.DataFrame, k: int | None) -> str:
    """The study's question and, per primary endpoint × arm, each block's effect and verdict; with two
    blocks, whether the explore conclusion replicated on the confirm seeds (``stats.replication``)."""
    heads = _comparison_heads(COMPARED, k)
    prim = comparisons[comparisons["family"] == "primary"] if not comparisons.empty else comparisons
    endpoints = "; ".join(
        f"`{e.metric}` ({e.direction.value} is better, "
        + (f"equivalence margin ±{fmt_value(e.margin)})" if e.margin is not None else "no equivalence margin)")
        for e in study.primary
    )
    blocks = [b for b in REQUIRED_BLOCKS if not prim.empty and b in set(prim["block"])]
    lines = [
        f"### Study: {study.question}",
        "",
        f"Primary endpoints: {endpoints}. Baseline: `{study.baseline}`. Blocks: "
        + ", ".join(f"{b} ({_seeds_text(study, b)})" for b in sorted(study.blocks, key=_block_rank))
        + f". Verdicts at family-wise α = {stats.ALPHA} (Holm over primary endpoints × arms, per block); "
        "`replicated` is defined in docs/studies.md.",
        "",
    ]
    if prim.empty:
        return "\n".join(lines + ["No primary comparison could be made (no completed baseline runs).", ""])
    header = ["group", "endpoint"] + [f"{b}: Δ [95% CI] p (Holm) → verdict" for b in blocks]
    if len(blocks) == 2:
        header.append("replication")
    body = []
    for (group, metric), g in prim.groupby(["group", "metric"], sort=False):
        cell = {r["block"]: r for _, r in g.iterrows()}
        row = [group, heads.get(metric, metric)]
        row += [fmt_comparison(cell[b], heads) if b in cell else "–" for b in blocks]
        if len(blocks) == 2:
            e, c = cell.get(blocks[0]), cell.get(blocks[1])
            row.append(
                stats.replication(e["verdict"], e["diff"], c["verdict"], c["diff"])
                if e is not None and c is not None
                else "–"
            )
        body.append(row)
    return "\n".join(lines + [markdown_table(header, body), ""])


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


def _group_rows(groups: pd.DataFrame, columns: Sequence[str], several_dirs: bool) -> list[list[str]]:
    body = []
    for _, g in groups.iterrows():
        cells = [g["group"]] + ([_sources_cell(g)] if several_dirs else []) + [_runs_cell(g)]
        for c in columns:
            cell = fmt_mean_ci(g[f"{c}_mean"], g[f"{c}_ci95"], int(g[f"{c}_n"]))
            if c == "steps_to_threshold" and g["n_completed"]:
                cell += f" ({int(g[f'{c}_n'])}/{g['n_completed']} reached)"
            cells.append(cell)
        body.append(cells)
    return body


def _heading(sweep: Sweep) -> list[str]:
    dirs = sweep.dirs if isinstance(sweep, Sweeps) else [sweep.sweep_dir]
    if len(dirs) == 1:
        return [f"## Sweep {dirs[0]}"]
    return [f"## Sweeps compared ({len(dirs)} directories)", ""] + [f"- [{i + 1}] {d}" for i, d in enumerate(dirs)]


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
    study: StudyConfig | None = None,
    baseline_source: dict[str, str] | None = None,
) -> str:
    """The heading (every directory), per seed block: the comparison table (mean ± 95% CI over
    completed seeds, with n), the paired differences against the baseline group and the post-event
    diagnostics; then the study's verdicts (both blocks side by side) and the list of all runs."""
    k = max((_largest_k(r.validation) or 0 for r in sweep.runs), default=0) or None
    heading = {m: h.replace("pass@k", f"pass@{k}") if k else h for m, h, _ in METRICS}
    several_dirs = isinstance(sweep, Sweeps) and len(sweep.dirs) > 1
    header = ["group"] + (["sweep"] if several_dirs else []) + ["runs"] + [heading[c] for c in columns]
    comparisons = comparisons if comparisons is not None else pd.DataFrame()
    fixed = ", ".join(f"{k}={v}" for k, v in sweep.fixed.items()) or "none"
    n_bad = int((runs["status"] != "completed").sum())
    blocks = list(dict.fromkeys(groups["block"])) if "block" in groups else [NO_BLOCK]
    parts = [
        *_heading(sweep),
        "",
        f"Grouped by: {', '.join(sweep.group_keys) or '(nothing varies but the seed)'}; fixed: {fixed}.",
        f"Cells: mean ± 95% CI half-width (Student t, over completed seeds; n = ok runs). "
        f"Threshold: trailing {window}-step mean reward ≥ {threshold}.",
        "",
        *[f"Note: {n}." for n in notes],
        "",
    ]
    for block in blocks:
        g = groups[groups["block"] == block] if "block" in groups else groups
        if len(blocks) > 1 or block != NO_BLOCK:
            seeds = f" ({_seeds_text(study, block)})" if study is not None and block in study.blocks else ""
            parts += [f"### Block `{block}`{seeds}", ""]
        parts += [markdown_table(header, _group_rows(g, columns, several_dirs)), ""]
        c = comparisons
        if not c.empty and "block" in c:
            c = c[c["block"] == block]
        source = (baseline_source or {}).get(block, "")
        parts.append(comparison_markdown(c, baseline, k, window, compared, source, study))
        parts.append(event_markdown(g, window))
    if study is not None:
        parts.append(study_markdown(study, comparisons, k))
    parts += [f"### Runs ({len(runs)} total, {n_bad} not completed)", ""]
    by_block = len(blocks) > 1
    run_rows = [
        [
            r["group"],
            *([r["block"]] if by_block else []),
            r["seed"],
            r["status"],
            int(r["steps_logged"]),
            fmt_value(r["success_final"]),
            fmt_value(r["time_per_step_ms"]),
            _first_line(r["error"]),
        ]
        for _, r in runs.iterrows()
    ]
    run_header = [
        "group",
        *(["block"] if by_block else []),
        "seed",
        "status",
        "steps",
        "success (last 10%)",
        "ms/step",
        "error",
    ]
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
    comparisons: pd.DataFrame = field(default_factory=pd.DataFrame)
    study: StudyConfig | None = None


def load_sweeps(sweep_dirs: Sequence[str | Path]) -> Sweeps:
    """One sweep, or several read together. Each run keeps the label its own sweep gives it (so a key
    only another sweep varies never appears empty in a label); the group keys are the union of every
    sweep's varied keys; a key is fixed when every sweep fixes it to the same value. Runs whose
    settings differ under one label are split later (``split_inconsistent_groups``), never pooled."""
    sweeps = [load_sweep(d) for d in sweep_dirs]
    runs = [r for sw in sweeps for r in sw.runs]
    keys = list(dict.fromkeys(k for sw in sweeps for k in sw.group_keys))
    fixed = {
        k: v for k, v in sweeps[0].fixed.items() if k not in keys and all(sw.fixed.get(k) == v for sw in sweeps[1:])
    }
    origin = {id(r): i for i, sw in enumerate(sweeps) for r in sw.runs}
    label = {id(r): group_label(sw, r) for sw in sweeps for r in sw.runs} if len(sweeps) > 1 else {}
    return Sweeps(sweeps[0].sweep_dir, runs, keys, fixed, [sw.sweep_dir for sw in sweeps], origin, label)


def find_group(label: str, sweep: Sweep, names: Sequence[str]) -> str | None:
    """The group a baseline label names, also when the grid was narrowed on the command line: the
    study's ``factor=1.0, step=keep`` is the group ``1.0`` of a sweep run with ``opt_reset.step=keep``
    (every ``key=value`` of the label must hold for the group's runs; keys as labels shorten them)."""
    if label in names:
        return label
    if "=" not in label:
        return None
    pairs = dict(part.split("=", 1) for part in label.split(", ") if "=" in part)
    for name in names:
        members = [r for r in sweep.runs if group_label(sweep, r) == name]
        short = [{k.split(".")[-1]: v for k, v in r.overrides.items()} for r in members]
        if members and all(all(o.get(k) == v for k, v in pairs.items()) for o in short):
            return name
    return None


def choose_baseline(
    sweep: Sweeps, names: Sequence[str], requested: str | None, strict: bool, study: StudyConfig | None
) -> tuple[str | None, StudyConfig | None, list[str]]:
    """(baseline group, the study if its primary family still applies, notes).

    Order: ``--baseline`` (or the grid's callback setting), else the study's declared baseline, else
    A1 / keep, else the first group. A baseline other than the study's makes every cell descriptive.
    With several directories the fallback "first group" is refused (it would be an arbitrary pick
    from one of them): name the baseline with ``--baseline``."""
    notes: list[str] = []
    if requested is not None and requested not in names:
        if strict:
            raise SweepDirError(f"--baseline {requested!r} is not a group of this sweep; groups: {list(names)}")
        notes.append(f"baseline {requested!r} (from the grid's config) is not a group here; using the default")
        requested = None
    if study is not None:
        if requested is not None and requested != find_group(study.baseline, sweep, names):
            notes.append(
                f"baseline {requested!r} is not the study's declared `{study.baseline}`: every cell is descriptive"
            )
            study = None
        elif (found := find_group(study.baseline, sweep, names)) is None:
            notes.append(f"the study's baseline `{study.baseline}` is not a group here: every cell is descriptive")
            study = None
        else:
            if found != study.baseline:
                notes.append(f"the study's baseline `{study.baseline}` is the group `{found}` here")
            requested = found
    if requested is not None:
        return requested, study, notes
    chosen = default_baseline(names)
    if len(sweep.dirs) > 1 and len(names) > 1 and chosen not in ("A1", "keep"):
        raise SweepDirError(
            f"{len(sweep.dirs)} sweeps and no group named A1 or keep: pass --baseline GROUP (groups: {list(names)})"
        )
    return chosen, study, notes


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
    and return everything. ``baseline``: the group others are compared with (default: the study's,
    else A1, keep, or the first group of a single sweep)."""
    dirs = [sweep_dir] if isinstance(sweep_dir, (str, Path)) else list(sweep_dir)
    sweep = load_sweeps(dirs)
    notes = split_inconsistent_groups(sweep)
    study, study_notes = read_study(sweep)
    notes += study_notes
    runs = run_table(sweep, threshold, window)
    groups = group_table(runs, sweep.group_keys)
    names = list(dict.fromkeys(groups["group"]))
    baseline, study, baseline_notes = choose_baseline(sweep, names, baseline, strict_baseline, study)
    notes += baseline_notes
    source = {}  # block -> where its baseline runs come from, when several directories are read
    if len(sweep.dirs) > 1:
        for block in dict.fromkeys(runs["block"]):
            base_dirs = set(runs.loc[(runs["block"] == block) & (runs["group"] == baseline), "run_dir"])
            base_runs = [r for r in sweep.runs if r.group == baseline and str(r.run_dir) in base_dirs]
            source[block] = f" (from sweep {sweep.sources(base_runs)})" if base_runs else ""
    routed = [m for m in ROUTE_METRICS if m in runs and runs[m].notna().any()]
    compared = COMPARED + [(m, "Δ " + dict((x, h) for x, h, _ in METRICS)[m]) for m in routed]
    per_block = []
    for block in dict.fromkeys(runs["block"]):
        c = compare_groups(sweep, runs[runs["block"] == block], baseline, window, compared, study)
        if not c.empty:
            c.insert(0, "block", block)
            per_block.append(c)
    comparisons = pd.concat(per_block, ignore_index=True) if per_block else pd.DataFrame()
    md = markdown_report(
        sweep, runs, groups, threshold, window, columns=PRINTED + routed, comparisons=comparisons,
        baseline=baseline, notes=notes, compared=compared, study=study, baseline_source=source,
    )  # fmt: skip
    plan = seed_plan(comparisons)  # seeds the next block needs per primary cell (empty without a study)
    md += seed_plan_markdown(plan)
    out = Path(out_dir) if out_dir else sweep.sweep_dir / OUT_SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    if not plan.empty:
        plan.to_csv(out / "seed_plan.csv", index=False)
    runs.to_csv(out / "runs.csv", index=False)
    groups.to_csv(out / "groups.csv", index=False)
    comparisons.to_csv(out / "comparisons.csv", index=False)
    (out / "table.md").write_text(md)
    paths: list[Path] = []
    if figures:
        from prorl_bench.sweeps.plots import write_figures  # seaborn/matplotlib only when drawing

        paths = write_figures(sweep, runs, out, window=window, baseline=baseline)
    return AggregateResult(sweep, runs, groups, md, out, paths, comparisons, study)


def print_result(res: AggregateResult, stream=None) -> None:
    stream = stream or sys.stdout
    print(res.markdown, file=stream)
    print(f"[prorl-bench-aggregate] tables: {res.out_dir}/{{runs.csv,groups.csv,table.md}}", file=stream)
    for p in res.figures:
        print(f"[prorl-bench-aggregate] figure: {p}", file=stream)
    stream.flush()


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

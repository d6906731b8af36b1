"""Paired statistics against a reference arm: per (group, metric) the difference to the baseline group
(paired by seed where the runs share base and prompt stream, Welch otherwise), its family (a study's
primary endpoints get Holm-adjusted p, TOST p and a verdict; every other cell is descriptive)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from prorl_bench.config.metric_catalog import DEFAULT_WINDOW
from prorl_bench.config.study import Endpoint, StudyConfig
from prorl_bench.sweeps import stats
from prorl_bench.sweeps.run_figures import column, event_steps
from prorl_bench.sweeps.sweepdir import RunRecord, Sweep, base_per_seed, pair_key

# Paired comparisons against the baseline group: (metric, heading) in table order.
COMPARED = [
    ("success_final", "Δ success"),
    ("reward_auc", "Δ reward AUC"),
    ("val_pass1_final", "Δ val pass@1"),
    ("val_passk_final", "Δ val pass@k"),
]


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
        if paired:
            cells = _paired_cells(metrics, members, base, shared, by_dir, window)
        else:
            cells = [(m, [r[m] for _, r in member_rows], [r[m] for _, r in base_rows], False) for m in metrics]
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
        adjust_and_judge(table, primary)
    return table


def _paired_cells(metrics, members: dict, base: dict, shared: list, by_dir: dict, window: int) -> list[tuple]:
    """(metric, values, baseline values, paired=True) per metric over the shared pairs, then the post-event
    windows (the run's steps after each event minus the same steps of its paired baseline run)."""
    cells = [(m, [members[k][m] for k in shared], [base[k][m] for k in shared], True) for m in metrics]
    for metric, col in (("post_reward", "reward/mean"), ("post_success", "success_rate")):
        pairs = [(by_dir[members[k]["run_dir"]], by_dir[base[k]["run_dir"]]) for k in shared]
        diffs = [_event_window_diff(run, ref, col, window) for run, ref in pairs]
        if stats.finite(diffs):
            cells.append((f"{metric}_vs_baseline", diffs, [0.0] * len(diffs), True))
    return cells


def adjust_and_judge(table: pd.DataFrame, primary: dict[str, Endpoint]) -> None:
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
    events = event_steps(run, "reset") + event_steps(run, "growth")
    rs, bs = [float(x) for x in run.metrics["step"]], [float(x) for x in ref.metrics["step"]]
    mine, theirs = column(run.metrics, col), column(ref.metrics, col)
    d = stats.finite([stats.window_mean(rs, mine, e, e + w) - stats.window_mean(bs, theirs, e, e + w) for e in events])
    return sum(d) / len(d) if d else stats.NAN

"""The Markdown report of an aggregated sweep: number formatting, the per-block group tables, the
paired-difference tables, the post-event diagnostics, the study's verdicts and the runs list.
``markdown_report(Report(...))`` renders one ``Report``; nothing here computes a statistic."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from prorl_bench.config.metric_catalog import DEFAULT_THRESHOLD, DEFAULT_WINDOW, METRIC_NAMES, METRICS
from prorl_bench.config.study import REQUIRED_BLOCKS, StudyConfig
from prorl_bench.sweeps import stats
from prorl_bench.sweeps.compare import COMPARED
from prorl_bench.sweeps.grouping import NO_BLOCK, STATUSES, Sweeps, block_rank, first_line
from prorl_bench.sweeps.run_figures import largest_k
from prorl_bench.sweeps.sweepdir import Sweep

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
        + ", ".join(f"{b} ({_seeds_text(study, b)})" for b in sorted(study.blocks, key=block_rank))
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


@dataclass
class Report:
    """Everything the Markdown report shows, computed elsewhere (``aggregate.aggregate`` fills it).

    ``runs``/``groups``/``comparisons``: the tables of ``grouping.run_table``, ``grouping.group_table``
    and ``compare.compare_groups`` (one per block, concatenated with a ``block`` column); ``columns``:
    the figures of the group table; ``compared``: (metric, heading) of the paired-difference table;
    ``baseline_source``: block -> " (from sweep [i])" when several directories are read;
    ``threshold`` in reward units, ``window`` in RL steps."""

    sweep: Sweep
    runs: pd.DataFrame
    groups: pd.DataFrame
    threshold: float = DEFAULT_THRESHOLD
    window: int = DEFAULT_WINDOW
    columns: Sequence[str] = tuple(PRINTED)
    comparisons: pd.DataFrame = field(default_factory=pd.DataFrame)
    baseline: str | None = None
    notes: Sequence[str] = ()
    compared: Sequence[tuple[str, str]] = tuple(COMPARED)
    study: StudyConfig | None = None
    baseline_source: dict[str, str] = field(default_factory=dict)


def markdown_report(report: Report) -> str:
    """The heading (every directory), per seed block: the comparison table (mean ± 95% CI over
    completed seeds, with n), the paired differences against the baseline group and the post-event
    diagnostics; then the study's verdicts (both blocks side by side) and the list of all runs."""
    r = report
    k = max((largest_k(run.validation) or 0 for run in r.sweep.runs), default=0) or None
    fixed = ", ".join(f"{key}={v}" for key, v in r.sweep.fixed.items()) or "none"
    blocks = list(dict.fromkeys(r.groups["block"])) if "block" in r.groups else [NO_BLOCK]
    parts = [
        *_heading(r.sweep),
        "",
        f"Grouped by: {', '.join(r.sweep.group_keys) or '(nothing varies but the seed)'}; fixed: {fixed}.",
        f"Cells: mean ± 95% CI half-width (Student t, over completed seeds; n = ok runs). "
        f"Threshold: trailing {r.window}-step mean reward ≥ {r.threshold}.",
        "",
        *[f"Note: {n}." for n in r.notes],
        "",
    ]
    for block in blocks:
        parts += _block_sections(r, block, show_heading=len(blocks) > 1 or block != NO_BLOCK, k=k)
    if r.study is not None:
        parts.append(study_markdown(r.study, r.comparisons, k))
    parts += _runs_list(r.runs, by_block=len(blocks) > 1)
    return "\n".join(parts) + "\n"


def _block_sections(r: Report, block: str, show_heading: bool, k: int | None) -> list[str]:
    """One seed block: its group table, its paired differences and its post-event diagnostics."""
    heading = {m: h.replace("pass@k", f"pass@{k}") if k else h for m, h, _ in METRICS}
    several_dirs = isinstance(r.sweep, Sweeps) and len(r.sweep.dirs) > 1
    header = ["group"] + (["sweep"] if several_dirs else []) + ["runs"] + [heading[c] for c in r.columns]
    g = r.groups[r.groups["block"] == block] if "block" in r.groups else r.groups
    parts = []
    if show_heading:
        seeds = f" ({_seeds_text(r.study, block)})" if r.study is not None and block in r.study.blocks else ""
        parts += [f"### Block `{block}`{seeds}", ""]
    parts += [markdown_table(header, _group_rows(g, r.columns, several_dirs)), ""]
    c = r.comparisons
    if not c.empty and "block" in c:
        c = c[c["block"] == block]
    source = r.baseline_source.get(block, "")
    parts.append(comparison_markdown(c, r.baseline, k, r.window, r.compared, source, r.study))
    parts.append(event_markdown(g, r.window))
    return parts


def _runs_list(runs: pd.DataFrame, by_block: bool) -> list[str]:
    """Every run (not completed ones included) with its status and first error line."""
    n_bad = int((runs["status"] != "completed").sum())
    rows = [
        [
            r["group"],
            *([r["block"]] if by_block else []),
            r["seed"],
            r["status"],
            int(r["steps_logged"]),
            fmt_value(r["success_final"]),
            fmt_value(r["time_per_step_ms"]),
            first_line(r["error"]),
        ]
        for _, r in runs.iterrows()
    ]
    header = ["group", *(["block"] if by_block else []), "seed", "status", "steps", "success (last 10%)", "ms/step",
              "error"]  # fmt: skip
    return [f"### Runs ({len(runs)} total, {n_bad} not completed)", "", markdown_table(header, rows)]

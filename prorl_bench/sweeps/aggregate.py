"""Sweep aggregation: per-run figures, per-group mean ± 95% CI over seeds, CSV + Markdown + figures.

Use it three ways:

* automatically at the end of a multirun (``callback.AggregateCallback``, registered in ``conf/config.yaml``),
* ``prorl-bench-aggregate SWEEP_DIR`` (Hydra skips the callback when any job failed),
* from Python / the notebook: ``aggregate(sweep_dir)`` or the pieces ``grouping.load_sweeps`` ->
  ``grouping.run_table`` -> ``grouping.group_table`` -> ``compare.compare_groups`` ->
  ``markdown.markdown_report``.

This module is the entry point only; the concepts live in ``run_figures`` (one run's figures),
``grouping`` (runs table, groups, blocks, study, baseline), ``compare`` (paired statistics against
the baseline) and ``markdown`` (the report).

Groups are the combinations of the overrides that vary across the sweep, seed excluded. Statistics
use completed runs only; failed, preempted, incomplete and missing runs are counted per group and
listed with their error in the runs table — never dropped.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from prorl_bench.config.metric_catalog import DEFAULT_THRESHOLD, DEFAULT_WINDOW, METRICS
from prorl_bench.config.study import StudyConfig
from prorl_bench.sweeps import provenance_check
from prorl_bench.sweeps.compare import COMPARED, compare_groups
from prorl_bench.sweeps.grouping import (
    choose_baseline,
    group_table,
    load_sweeps,
    read_study,
    run_table,
    split_inconsistent_groups,
)
from prorl_bench.sweeps.markdown import PRINTED, Report, markdown_report, markdown_table
from prorl_bench.sweeps.report import write_report
from prorl_bench.sweeps.run_figures import COVERAGE_METRICS, ROUTE_METRICS
from prorl_bench.sweeps.seed_plan import seed_plan, seed_plan_markdown
from prorl_bench.sweeps.sweepdir import Sweep, SweepDirError

OUT_SUBDIR = "aggregate"


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
    provenance_warnings: list[str] = field(default_factory=list)
    report: Path | None = None  # report.html (report.py)


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
    summaries = {str(r.run_dir): r.summary for r in sweep.runs if r.run_dir}
    prov_warnings, prov_header, prov_rows = provenance_check.check(
        [(g, seed, summaries.get(d)) for g, seed, d in zip(runs["group"], runs["seed"], runs["run_dir"])]
    )
    notes = [f"WARNING: {w}" for w in prov_warnings] + notes  # said before any comparison
    source = {}  # block -> where its baseline runs come from, when several directories are read
    if len(sweep.dirs) > 1:
        for block in dict.fromkeys(runs["block"]):
            base_dirs = set(runs.loc[(runs["block"] == block) & (runs["group"] == baseline), "run_dir"])
            base_runs = [r for r in sweep.runs if r.group == baseline and str(r.run_dir) in base_dirs]
            source[block] = f" (from sweep {sweep.sources(base_runs)})" if base_runs else ""
    routed = [m for m in [*ROUTE_METRICS, *COVERAGE_METRICS] if m in runs and runs[m].notna().any()]
    compared = COMPARED + [(m, "Δ " + dict((x, h) for x, h, _ in METRICS)[m]) for m in routed]
    per_block = []
    for block in dict.fromkeys(runs["block"]):
        c = compare_groups(sweep, runs[runs["block"] == block], baseline, window, compared, study)
        if not c.empty:
            c.insert(0, "block", block)
            per_block.append(c)
    comparisons = pd.concat(per_block, ignore_index=True) if per_block else pd.DataFrame()
    report = Report(
        sweep, runs, groups, threshold, window, columns=[*PRINTED, *routed], comparisons=comparisons,
        baseline=baseline, notes=notes, compared=compared, study=study, baseline_source=source,
    )  # fmt: skip
    md = markdown_report(report)
    plan = seed_plan(comparisons)  # seeds the next block needs per primary cell (empty without a study)
    md += seed_plan_markdown(plan)
    md += f"\n### Provenance (per group)\n\n{markdown_table(prov_header, prov_rows)}\n"
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
    res = AggregateResult(sweep, runs, groups, md, out, paths, comparisons, study, prov_warnings)
    res.report = write_report(res)  # report.html: the tables, figures inline, provenance, the commands
    return res


def print_result(res: AggregateResult, stream=None) -> None:
    stream = stream or sys.stdout
    for w in res.provenance_warnings:
        print(f"prorl-bench-aggregate: WARNING: {w}", file=sys.stderr)
    print(res.markdown, file=stream)
    print(f"[prorl-bench-aggregate] tables: {res.out_dir}/{{runs.csv,groups.csv,table.md}}", file=stream)
    for p in res.figures:
        print(f"[prorl-bench-aggregate] figure: {p}", file=stream)
    if res.report is not None:
        print(f"[prorl-bench-aggregate] report: {res.report}", file=stream)
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

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
from prorl_bench.sweepdir import RunRecord, Sweep, SweepDirError, load_sweep

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
    ("recovery_steps", "recovery (steps)", "mean steps after a reset until windowed reward regains pre-reset level"),
    ("recovery_reported", "recovery (summary)", "post-reset recovery as reported by the trainer in summary.json"),
    ("wall_time_s", "wall (s)", "whole run wall time incl. warm-up load and validation, seconds"),
]
METRIC_NAMES = [m for m, _, _ in METRICS]
# The compact table printed at the end of a sweep (all columns are in the CSV files).
PRINTED = [
    "success_final",
    "val_success_final",
    "reward_auc",
    "steps_to_threshold",
    "kl_mean",
    "ref_fwd_per_step",
    "ref_share_pct",
    "time_per_step_ms",
    "recovery_steps",
]
STATUSES = ("completed", "failed", "preempted", "incomplete", "missing")


def _col(df: pd.DataFrame, key: str) -> list[float | None]:
    if key not in df.columns:
        return []
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in df[key]]


def _event_steps(run: RunRecord, name: str) -> list[float]:
    return [float(e["step"]) for e in run.events if e.get("event") == name and "step" in e]


REPORTED_RECOVERY_KEY = "recovery/mean_steps"  # written by the trainer for variant C (None: never recovered)


def _reported_recovery(summary: dict[str, Any] | None) -> float:
    """The trainer's own post-reset recovery figure from summary.json (nan when absent or null)."""
    value = (summary or {}).get(REPORTED_RECOVERY_KEY)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return stats.NAN


def run_metrics(run: RunRecord, threshold: float = DEFAULT_THRESHOLD, window: int = DEFAULT_WINDOW) -> dict[str, float]:
    """The per-run figures of ``METRICS`` from one run's files (nan where not applicable)."""
    m = run.metrics
    out = dict.fromkeys(METRIC_NAMES, stats.NAN)
    out["steps_logged"] = float(len(m))
    out["recovery_reported"] = _reported_recovery(run.summary)
    if run.summary and isinstance(run.summary.get("wall_time_s"), (int, float)):
        out["wall_time_s"] = float(run.summary["wall_time_s"])
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
    rec = stats.finite(stats.recovery_steps(steps, reward, resets, window))
    out["recovery_steps"] = sum(rec) / len(rec) if rec else stats.NAN
    if not run.validation.empty and "val/success_sampled" in run.validation.columns:
        out["val_success_final"] = float(run.validation["val/success_sampled"].iloc[-1])
    return out


def group_label(sweep: Sweep, run: RunRecord) -> str:
    """Readable group name: ``A0`` for one varied key, ``placement=reward, beta=0.01`` for several."""
    if not sweep.group_keys:
        return "all"
    values = sweep.group_of(run)
    if len(values) == 1:
        return values[0]
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(sweep.group_keys, values))


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


def markdown_report(
    sweep: Sweep,
    runs: pd.DataFrame,
    groups: pd.DataFrame,
    threshold: float = DEFAULT_THRESHOLD,
    window: int = DEFAULT_WINDOW,
    columns: Sequence[str] = PRINTED,
) -> str:
    """The comparison table (mean ± 95% CI over completed seeds, with n) and the list of all runs."""
    heading = {m: h for m, h, _ in METRICS}
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


def aggregate(
    sweep_dir: str | Path,
    out_dir: str | Path | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    window: int = DEFAULT_WINDOW,
    figures: bool = True,
) -> AggregateResult:
    """Load a sweep, write ``runs.csv``, ``groups.csv``, ``table.md`` and the figures into ``out_dir``
    (default ``SWEEP_DIR/aggregate``), and return everything."""
    sweep = load_sweep(sweep_dir)
    runs = run_table(sweep, threshold, window)
    groups = group_table(runs, sweep.group_keys)
    md = markdown_report(sweep, runs, groups, threshold, window)
    out = Path(out_dir) if out_dir else sweep.sweep_dir / OUT_SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / "runs.csv", index=False)
    groups.to_csv(out / "groups.csv", index=False)
    (out / "table.md").write_text(md)
    paths: list[Path] = []
    if figures:
        from prorl_bench.plots import write_figures  # seaborn/matplotlib only when drawing

        paths = write_figures(sweep, runs, out, window=window)
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

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, window: int = DEFAULT_WINDOW, figures: bool = True):
        self.threshold, self.window, self.figures = threshold, window, figures

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        target = os.environ.get(SWEEP_DIR_FILE_ENV)
        if target:
            Path(target).write_text(str(Path(config.hydra.sweep.dir).resolve()))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        res = aggregate(config.hydra.sweep.dir, threshold=self.threshold, window=self.window, figures=self.figures)
        print_result(res)


def main(argv: Sequence[str] | None = None) -> int:
    """``prorl-bench-aggregate SWEEP_DIR``: tables and figures of a finished (or failed) sweep."""
    p = argparse.ArgumentParser(prog="prorl-bench-aggregate", description=__doc__.splitlines()[0])
    p.add_argument("sweep_dir", type=Path, help="a Hydra multirun directory, e.g. outputs/sweeps/ablation/<date>")
    p.add_argument("--out", type=Path, default=None, help=f"output directory (default SWEEP_DIR/{OUT_SUBDIR})")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="reward threshold (reward units)")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="smoothing window, RL steps")
    p.add_argument("--no-figures", action="store_true", help="tables only")
    args = p.parse_args(argv)
    try:
        res = aggregate(args.sweep_dir, args.out, args.threshold, args.window, figures=not args.no_figures)
    except SweepDirError as e:
        print(f"prorl-bench-aggregate: {e}", file=sys.stderr)
        return 2
    print_result(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Seaborn figures of a sweep, written next to its tables (PNG, 130 dpi).

* ``curves.png``: reward and KL-to-reference per group over RL steps, one line per group (mean over
  seeds of a trailing rolling mean), band = ±1 s.d. over seeds, dashed/dotted verticals at reference
  resets / topology growths (from ``events.jsonl``; group colour, dark grey when groups share a step).
* ``stage_time.png``: mean wall time per RL step split by stage (ms), one stacked bar per group.
* ``reference_cost.png``: reference forwards, tokens and milliseconds per RL step per group.

Only runs with logged metrics are drawn (failed-at-start and missing runs have none).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt  # headless machines fall back to Agg; notebooks keep their inline backend
import pandas as pd
import seaborn as sns

from prorl_bench import stats
from prorl_bench.accounting import STAGES as ACCOUNTING_STAGES
from prorl_bench.aggregate import group_label
from prorl_bench.sweepdir import Sweep

STAGES = [f"time/{stage}" for stage in ACCOUNTING_STAGES]
MARKERS = {"reset": "--", "growth": ":"}
DPI = 130


def curves_frame(sweep: Sweep, window: int = 5) -> pd.DataFrame:
    """Long table: group, seed, status, step, reward (smoothed), kl (smoothed) for runs with metrics."""
    frames = []
    for run in sweep.runs:
        m = run.metrics
        if m.empty or "step" not in m:
            continue
        f = pd.DataFrame({"step": m["step"].astype(float)})
        for col, name in (("reward/mean", "reward"), ("kl/ref", "kl")):
            vals = list(m[col]) if col in m else [None] * len(m)
            f[name] = stats.rolling_mean(vals, window)
        f["group"], f["seed"], f["status"] = group_label(sweep, run), run.seed, run.status
        frames.append(f)
    cols = ["step", "reward", "kl", "group", "seed", "status"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def events_frame(sweep: Sweep) -> pd.DataFrame:
    """Long table of reset / growth events: group, seed, step, event, reason."""
    rows = [
        {
            "group": group_label(sweep, r),
            "seed": r.seed,
            "step": float(e["step"]),
            "event": e["event"],
            "reason": e.get("reason", ""),
        }
        for r in sweep.runs
        for e in r.events
        if e.get("event") in MARKERS and "step" in e
    ]
    return pd.DataFrame(rows, columns=["group", "seed", "step", "event", "reason"])


def stage_frame(sweep: Sweep) -> pd.DataFrame:
    """Long table: group, seed, stage, ms per RL step (mean over the run's steps)."""
    rows = []
    for run in sweep.runs:
        m = run.metrics
        if m.empty:
            continue
        for st in STAGES:
            vals = stats.finite(list(m[st])) if st in m else []
            ms = 1e3 * sum(vals) / len(vals) if vals else 0.0
            rows.append({"group": group_label(sweep, run), "seed": run.seed, "stage": st.split("/")[1], "ms": ms})
    return pd.DataFrame(rows, columns=["group", "seed", "stage", "ms"])


def _palette(groups: list[str]) -> dict[str, tuple]:
    return dict(zip(groups, sns.color_palette("colorblind", len(groups))))


def plot_curves(sweep: Sweep, window: int = 5) -> plt.Figure:
    curves = curves_frame(sweep, window)
    groups = list(dict.fromkeys(curves["group"]))
    pal = _palette(groups)
    fig, axes = plt.subplots(2, 1, figsize=(9, 7), sharex=True, constrained_layout=True)
    panels = (
        ("reward", f"reward (task units, 0–1)\ntrailing {window}-step mean"),
        ("kl", "KL(π_θ ‖ π_ref) per token (nats)\nconfigured estimator"),
    )
    for ax, (col, label) in zip(axes, panels):
        data = curves.dropna(subset=[col])
        if not data.empty:
            order = [g for g in groups if g in set(data.group)]
            # style per group too: variants with identical trajectories (A0/A1/A2) stay visible
            sns.lineplot(
                data=data,
                x="step",
                y=col,
                hue="group",
                hue_order=order,
                style="group",
                style_order=order,
                palette=pal,
                errorbar="sd",
                ax=ax,
            )
        else:
            ax.text(0.5, 0.5, "no reference KL in these runs (variant B has none)", ha="center", transform=ax.transAxes)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ev = events_frame(sweep)
    # one vertical per (event, step): in its group's colour, dark grey when several groups share it
    for (name, step), g in ev.groupby(["event", "step"]):
        groups_here = set(g["group"])
        color = pal.get(next(iter(groups_here)), "grey") if len(groups_here) == 1 else "0.3"
        for ax in axes:
            ax.axvline(step, color=color, ls=MARKERS[name], lw=1, alpha=0.6)
    handles, labels = axes[0].get_legend_handles_labels()
    for name, ls in MARKERS.items():
        if name in set(ev["event"]):
            handles.append(plt.Line2D([], [], color="grey", ls=ls))
            labels.append(f"{name} (event)")
    for ax in axes:
        if ax.get_legend():
            ax.get_legend().remove()
    if handles:
        axes[0].legend(handles, labels, title="group", fontsize=8, loc="best")
    axes[1].set_xlabel("RL step")
    n_seeds = curves.groupby("group")["seed"].nunique().max() if not curves.empty else 0
    fig.suptitle(f"Reward and KL to reference per group (band: ±1 s.d. over up to {n_seeds} seeds)")
    return fig


def plot_stage_time(sweep: Sweep) -> plt.Figure:
    st = stage_frame(sweep)
    table = st.groupby(["group", "stage"], sort=False)["ms"].mean().unstack("stage")
    table = table[[s.split("/")[1] for s in STAGES if s.split("/")[1] in table.columns]]
    fig, ax = plt.subplots(figsize=(9, 2.2 + 0.6 * max(1, len(table))), layout="constrained")
    left = pd.Series(0.0, index=table.index)
    colors = sns.color_palette("tab10", len(table.columns))
    for color, stage in zip(colors, table.columns):
        ax.barh(table.index, table[stage], left=left, color=color, label=stage)
        left = left + table[stage]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.1f} ms", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("wall time per RL step (ms), mean over steps and seeds")
    ax.set_ylabel("group")
    ax.set_xlim(0, float(left.max()) * 1.15 if len(left) else 1)
    fig.legend(title="stage", fontsize=8, ncols=len(table.columns), loc="outside lower center")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("Stage-time breakdown per RL step")
    return fig


def plot_reference_cost(runs: pd.DataFrame) -> plt.Figure:
    data = runs[runs["steps_logged"] > 0]
    panels = (
        ("ref_fwd_per_step", "reference forwards per RL step (count)"),
        ("ref_tokens_per_step", "reference tokens per RL step"),
        ("ref_ms_per_step", "reference time per RL step (ms)"),
    )
    groups = list(dict.fromkeys(data["group"]))
    fig, axes = plt.subplots(1, 3, figsize=(12, 1.6 + 0.5 * max(1, len(groups))), constrained_layout=True)
    for ax, (col, label) in zip(axes, panels):
        sns.barplot(
            data=data,
            y="group",
            x=col,
            hue="group",
            order=groups,
            palette=_palette(groups),
            errorbar="sd",
            legend=False,
            ax=ax,
        )
        for container in ax.containers:
            ax.bar_label(container, fmt="%.3g", fontsize=8, padding=2)
        ax.set_xlabel(label)
        ax.set_xlim(0, max(1.0, float(data[col].max()) * 1.25) if data[col].notna().any() else 1.0)
        ax.set_ylabel("group" if ax is axes[0] else "")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Reference-model cost (bars: mean over runs with metrics; whiskers: ±1 s.d. over seeds)")
    return fig


def write_figures(sweep: Sweep, runs: pd.DataFrame, out_dir: Path, window: int = 5) -> list[Path]:
    """Draw all figures into ``out_dir``; returns their paths (none when no run logged a step)."""
    if not (runs["steps_logged"] > 0).any():
        return []
    plt.switch_backend("agg")  # files only: never open windows from a sweep's end
    sns.set_theme(style="whitegrid", context="notebook")
    figs = {
        "curves.png": plot_curves(sweep, window),
        "stage_time.png": plot_stage_time(sweep),
        "reference_cost.png": plot_reference_cost(runs),
    }
    paths = []
    for name, fig in figs.items():
        path = Path(out_dir) / name
        fig.savefig(path, dpi=DPI)
        plt.close(fig)
        paths.append(path)
    return paths

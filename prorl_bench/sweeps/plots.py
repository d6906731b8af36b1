"""Seaborn figures of a sweep, written next to its tables (PNG, 130 dpi).

* ``curves.png``: reward and KL-to-reference per group over RL steps, one line per group (mean over
  seeds of a trailing rolling mean), band = ±1 s.d. over seeds, dashed/dotted verticals at reference
  resets / topology growths (from ``events.jsonl``; group colour, dark grey when groups share a step).
* ``stage_time.png``: mean wall time per RL step split by stage (ms), one stacked bar per group.
* ``reference_cost.png``: reference forwards, tokens and milliseconds per RL step per group, and the
  bytes the reference model holds (B: none; a LoRA adapter reference: the adapters only).
* ``passk.png``: held-out pass@k against k per group, the base (step 0) dashed and the final policy
  solid — RL typically raises pass@1 and lowers pass@k at large k.
* ``difficulty.png``: final held-out success per difficulty label per group.
* ``post_event.png``: reward around each reset/growth (steps relative to the event), group minus its
  paired baseline run.

Every band and error bar is the table's interval: the mean ± the 95% Student-t half-width over seeds.

Only runs with logged metrics are drawn (failed-at-start and missing runs have none).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt  # headless machines fall back to Agg; notebooks keep their inline backend
import pandas as pd
import seaborn as sns

from prorl_bench.run.outputs import STAGES as ACCOUNTING_STAGES
from prorl_bench.sweeps import stats
from prorl_bench.sweeps.sweepdir import Sweep, group_label, pair_key

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


def t_interval(values) -> tuple[float, float]:
    """The tables' interval (mean ± 95% Student-t half-width) as a seaborn errorbar."""
    m, h, n = stats.mean_ci(list(values))
    if n < 2 or h != h:
        return m, m
    return m - h, m + h


def passk_frame(sweep: Sweep) -> pd.DataFrame:
    """Long table: group, seed, which (base | final), k, pass@k — from the step-0 and last validation rows."""
    rows = []
    for run in sweep.runs:
        v = run.validation
        if run.status != "completed" or v.empty or "step" not in v:
            continue
        ks = sorted(int(c.split("@")[1]) for c in v.columns if c.startswith("val/pass@"))
        picks = [("final", v.iloc[-1])]
        if (v["step"] == 0).any():
            picks.append(("base (step 0)", v[v["step"] == 0].iloc[0]))
        label = group_label(sweep, run)
        for which, row in picks:
            for k in ks:
                rows.append({"group": label, "seed": run.seed, "which": which, "k": k, "pass@k": row[f"val/pass@{k}"]})
    return pd.DataFrame(rows, columns=["group", "seed", "which", "k", "pass@k"])


def plot_passk(sweep: Sweep) -> plt.Figure | None:
    data = passk_frame(sweep).dropna()
    if data.empty:
        return None
    groups = list(dict.fromkeys(data["group"]))
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    sns.lineplot(
        data=data, x="k", y="pass@k", hue="group", hue_order=groups, style="which",
        style_order=["final", "base (step 0)"], palette=_palette(groups), errorbar=t_interval, marker="o", ax=ax,
    )  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples per prompt)")
    ax.set_ylabel("held-out pass@k (unbiased estimator)")
    ax.set_title("pass@k: base (dashed) vs final policy (solid); band: 95% t-interval", fontsize=10)
    return fig


def plot_routing(sweep: Sweep) -> plt.Figure | None:
    """Gradient routing over training: held-out task success and hack rate per adapter mode (both,
    retain_only = forget ablated, forget_only), one line per group and mode; band: 95% t-interval."""
    rows = []
    for run in sweep.runs:
        v = run.validation
        if v.empty or "step" not in v:
            continue
        for mode in ("both", "retain_only", "forget_only"):
            for metric in ("success", "hack_rate"):
                col = f"route/{mode}/{metric}"
                if col in v.columns:
                    for step, value in zip(v["step"], v[col]):
                        rows.append({"group": group_label(sweep, run), "mode": mode, "metric": metric,
                                     "step": step, "value": value})  # fmt: skip
    data = pd.DataFrame(rows).dropna() if rows else pd.DataFrame()
    if data.empty:
        return None
    groups = list(dict.fromkeys(data["group"]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True, sharex=True)
    for ax, metric, label in zip(axes, ("success", "hack_rate"), ("held-out task success", "held-out hack rate")):
        sns.lineplot(
            data=data[data["metric"] == metric], x="step", y="value", hue="group", hue_order=groups,
            style="mode", style_order=["both", "retain_only", "forget_only"], palette=_palette(groups),
            errorbar=t_interval, marker="o", ax=ax,
        )  # fmt: skip
        ax.set_ylabel(label)
        ax.set_xlabel("RL step")
    fig.suptitle("Gradient routing: adapter modes over training (retain_only = forget adapter ablated)", fontsize=10)
    return fig


def plot_difficulty(sweep: Sweep) -> plt.Figure | None:
    rows = []
    for run in sweep.runs:
        v = run.validation
        if run.status != "completed" or v.empty:
            continue
        last = v.iloc[-1]
        for c in v.columns:
            if c.startswith("val/by_difficulty/") and c.endswith("/success"):
                rows.append({"group": group_label(sweep, run), "difficulty": c.split("/")[2], "success": last[c]})
    data = pd.DataFrame(rows).dropna() if rows else pd.DataFrame()
    if data.empty:
        return None
    groups = list(dict.fromkeys(data["group"]))
    fig, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
    sns.barplot(
        data=data, x="difficulty", y="success", hue="group", hue_order=groups, palette=_palette(groups),
        errorbar=t_interval, ax=ax, order=sorted(set(data["difficulty"])),
    )  # fmt: skip
    ax.set_ylabel("held-out sampled success (final)")
    ax.set_title("Success per difficulty label (error bars: 95% t-interval over seeds)")
    return fig


def plot_post_event(sweep: Sweep, baseline: str | None, width: int = 10) -> plt.Figure | None:
    """Reward at steps e-width..e+width around each event, minus the paired baseline run's reward."""
    base_runs = {pair_key(r): r for r in sweep.runs if group_label(sweep, r) == baseline and not r.metrics.empty}
    rows = []
    for run in sweep.runs:
        if group_label(sweep, run) == baseline or run.metrics.empty or run.status != "completed":
            continue
        ref = base_runs.get(pair_key(run))
        if ref is None:
            continue
        mine = dict(zip(run.metrics["step"].astype(float), run.metrics["reward/mean"]))
        theirs = dict(zip(ref.metrics["step"].astype(float), ref.metrics["reward/mean"]))
        for e in run.events:
            if e.get("event") not in MARKERS:
                continue
            for t in range(-width, width + 1):
                s = float(e["step"]) + t
                if s in mine and s in theirs:
                    label = group_label(sweep, run)
                    rows.append({"group": label, "seed": run.seed, "t": t, "Δ reward": mine[s] - theirs[s]})
    data = pd.DataFrame(rows)
    if data.empty:
        return None
    data = data.groupby(["group", "seed", "t"], as_index=False)["Δ reward"].mean()  # one value per seed
    groups = list(dict.fromkeys(data["group"]))
    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    sns.lineplot(data=data, x="t", y="Δ reward", hue="group", hue_order=groups, palette=_palette(groups),
                 errorbar=t_interval, ax=ax)  # fmt: skip
    ax.axvline(0, color="0.3", ls="--", lw=1)
    ax.axhline(0, color="0.3", lw=0.8)
    ax.set_xlabel("RL steps relative to a reset / growth")
    ax.set_ylabel(f"reward − paired {baseline} run")
    ax.set_title("Around events: group minus its paired baseline run (band: 95% t-interval over seeds)")
    return fig


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
                errorbar=t_interval,
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
    fig.suptitle(f"Reward and KL to reference per group (band: 95% t-interval over up to {n_seeds} seeds)")
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
        ("ref_mb", "reference model memory (MB)"),
    )
    groups = list(dict.fromkeys(data["group"]))
    fig, axes = plt.subplots(1, 4, figsize=(15, 1.6 + 0.5 * max(1, len(groups))), constrained_layout=True)
    for ax, (col, label) in zip(axes, panels):
        sns.barplot(
            data=data,
            y="group",
            x=col,
            hue="group",
            order=groups,
            palette=_palette(groups),
            errorbar=t_interval,
            legend=False,
            ax=ax,
        )
        for container in ax.containers:
            ax.bar_label(container, fmt="%.3g", fontsize=8, padding=2)
        ax.set_xlabel(label)
        ax.set_xlim(0, max(1.0, float(data[col].max()) * 1.25) if data[col].notna().any() else 1.0)
        ax.set_ylabel("group" if ax is axes[0] else "")
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Reference-model cost (bars: mean over runs with metrics; whiskers: 95% t-interval over seeds)")
    return fig


def write_figures(
    sweep: Sweep, runs: pd.DataFrame, out_dir: Path, window: int = 5, baseline: str | None = None
) -> list[Path]:
    """Draw all figures into ``out_dir``; returns their paths (none when no run logged a step)."""
    if not (runs["steps_logged"] > 0).any():
        return []
    plt.switch_backend("agg")  # files only: never open windows from a sweep's end
    sns.set_theme(style="whitegrid", context="notebook")
    figs = {
        "curves.png": plot_curves(sweep, window),
        "stage_time.png": plot_stage_time(sweep),
        "reference_cost.png": plot_reference_cost(runs),
        "passk.png": plot_passk(sweep),
        "difficulty.png": plot_difficulty(sweep),
        "post_event.png": plot_post_event(sweep, baseline),
        "routing.png": plot_routing(sweep),
    }
    paths = []
    for name, fig in figs.items():
        if fig is None:  # nothing to draw (no pass@k logged, no events, ...)
            continue
        path = Path(out_dir) / name
        fig.savefig(path, dpi=DPI)
        plt.close(fig)
        paths.append(path)
    return paths

"""The routing study across recalls (sweeps/sweep/routing_oversight.yaml): one figure of held-out task
success against hack rate of the deployed model per recall, and the tables the README quotes.

    PYTHONPATH=. python benchmarks/routing_study.py [--root outputs/sweeps/routing_oversight] [--out DIR]

Reads, for every block (explore, confirm) and recall, the newest sweep directory
``ROOT/<block>/recall=<r>/<date>/`` through ``aggregate`` (the same per-run figures the sweep's own
table uses; its tables are written under OUT, never into the sweep directories). ``route_plain`` ignores the labels,
so it runs in the recall-1.0 sweep only and is drawn in every panel. Writes ``routing_oversight.png``
(x: hack rate, y: task success, forget adapter ablated; mean and 95% t interval over seeds; filled:
explore, hollow: confirm; the dashed line is the study's acceptable hack rate) and ``curves.md`` (the
held-out means at every evaluation step, per arm, recall and block: whether the curves settled).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy import stats

from prorl_bench.sweeps.aggregate import aggregate

ARMS = {"route_dual": ("routed (forget ablated)", "C0"), "route_filter": ("filter", "C1"),
        "route_penalize": ("penalize", "C2"), "route_plain": ("plain LoRA", "C3")}  # fmt: skip
ACCEPTABLE_HACK = 0.10  # the study's declared ceiling on the deployed model's held-out hack rate


def newest_sweeps(root: Path) -> dict[tuple[str, float], Path]:
    """(block, recall) -> the newest sweep directory under ``root/<block>/recall=<r>/``."""
    found = {}
    for d in sorted(root.glob("*/recall=*/*")):
        if (d / "multirun.yaml").is_file() or any(d.glob("+arm=*")):
            found[(d.parent.parent.name, float(d.parent.name.split("=")[1]))] = d  # sorted: newest last
    return found


def runs_table(sweeps: dict[tuple[str, float], Path], out: Path) -> pd.DataFrame:
    """One row per run: block, recall, arm, seed, success and hack rate of the deployed model. The
    per-sweep tables go under ``out``: the sweeps' own ``aggregate/`` directories are left as they are."""
    frames = []
    for (block, recall), d in sweeps.items():
        res = aggregate(d, out_dir=out / f"{block}_recall={recall:g}", figures=False)
        runs = res.runs.assign(block=block, recall=recall)
        frames.append(runs[["block", "recall", "arm", "seed", "status", "route_retain_success", "route_retain_hack"]])
    runs = pd.concat(frames, ignore_index=True)
    return runs[runs["status"] == "completed"]


def mean_ci(x: pd.Series) -> tuple[float, float]:
    """Mean and 95% Student t half-width over seeds."""
    x = x.dropna().to_numpy(float)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else np.nan
    return float(x.mean()), float(half)


def figure(runs: pd.DataFrame, out: Path) -> Path:
    recalls = sorted(runs["recall"].unique(), reverse=True)
    fig, axes = plt.subplots(1, len(recalls), figsize=(3.6 * len(recalls), 3.6), sharex=True, sharey=True)
    plain = runs[runs["arm"] == "route_plain"]
    for ax, r in zip(np.atleast_1d(axes), recalls, strict=True):
        here = pd.concat([runs[(runs["recall"] == r) & (runs["arm"] != "route_plain")], plain])
        for (arm, block), g in here.groupby(["arm", "block"]):
            label, color = ARMS[arm]
            (x, dx), (y, dy) = mean_ci(g["route_retain_hack"]), mean_ci(g["route_retain_success"])
            face = color if block == "explore" else "none"
            ax.errorbar(x, y, xerr=dx, yerr=dy, fmt="o", color=color, mfc=face, capsize=2,
                        label=f"{label}, {block}")  # fmt: skip
        ax.axvline(ACCEPTABLE_HACK, ls="--", color="grey", lw=0.8)
        ax.set_title(f"detector recall {r:g}")
        ax.set_xlabel("held-out hack rate (deployed)")
    np.atleast_1d(axes)[0].set_ylabel("held-out task success (deployed)")
    handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    path = out / "routing_oversight.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def curves(sweeps: dict[tuple[str, float], Path]) -> str:
    """Held-out success / hack rate of the deployed model at every evaluation, mean over seeds."""
    rows = []
    for (block, recall), d in sorted(sweeps.items()):
        for run in sorted(d.glob("+arm=*")):
            summary = run / "summary.json"
            if not summary.is_file() or json.loads(summary.read_text()).get("status") != "completed":
                continue  # the figure and tables use completed runs only
            arm = run.name.split(",")[0].split("=")[1]
            for line in (run / "validation.jsonl").read_text().splitlines():
                v = json.loads(line)
                s = v.get("route/retain_only/success", v.get("route/both/success"))
                h = v.get("route/retain_only/hack_rate", v.get("route/both/hack_rate"))
                rows.append({"block": block, "recall": recall, "arm": arm, "step": v["step"], "success": s, "hack": h})
    df = pd.DataFrame(rows).groupby(["block", "recall", "arm", "step"])[["success", "hack"]].mean().reset_index()
    steps = sorted(df["step"].unique())
    lines = ["| block | recall | arm | " + " | ".join(f"step {s}: success / hack" for s in steps) + " |",
             "|---|---|---|" + "---|" * len(steps)]  # fmt: skip
    for (block, recall, arm), g in df.groupby(["block", "recall", "arm"], sort=True):
        cells = [f"{r.success:.3f} / {r.hack:.3f}" for r in g.sort_values("step").itertuples()]
        lines.append(f"| {block} | {recall:g} | {ARMS[arm][0]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=Path("outputs/sweeps/routing_oversight"))
    p.add_argument("--out", type=Path, default=None, help="default: ROOT/summary")
    args = p.parse_args()
    out = args.out or args.root / "summary"
    out.mkdir(parents=True, exist_ok=True)
    sweeps = newest_sweeps(args.root)
    runs = runs_table(sweeps, out)
    runs.to_csv(out / "runs.csv", index=False)
    print(f"figure: {figure(runs, out)}")
    (out / "curves.md").write_text(curves(sweeps))
    print(f"curves: {out / 'curves.md'}")
    summary = runs.groupby(["recall", "arm", "block"]).agg(
        n=("seed", "size"), success=("route_retain_success", "mean"), hack=("route_retain_hack", "mean")
    )
    print(summary.round(3).to_string())


if __name__ == "__main__":
    main()

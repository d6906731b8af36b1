"""The prolonged regime's pilot (issue 43): does A1 at a medium beta plateau while beta 0 and resets keep rising?

    python benchmarks/prolonged_pilot.py run OUT --seeds 0 1          # train the pilot's arms (resumable)
    python benchmarks/prolonged_pilot.py report OUT                   # docs/data/prolonged_pilot.json + figure
    python benchmarks/prolonged_pilot.py markdown                     # the table docs/prolonged.md shows

``run`` trains each arm of ``ARMS`` for every seed through the installed ``prorl-bench`` (two at a time, one
torch thread each) into ``OUT/seed<S>/<arm>``; a run whose summary says completed is skipped, any other is
resumed from its checkpoint. ``report`` reads those run directories and writes a compact summary (per run:
the held-out pass@1 curve, the plateau and entropy-collapse figures of ``prorl_bench/run/curve_rules.py``,
ms per step) to ``--json`` and the figure (held-out pass@1 against step per arm, one line per seed, the
reset steps marked) to ``--figure``. ``markdown`` prints the table of docs/prolonged.md from the JSON only
(tests/docs/test_prolonged_doc.py regenerates it and compares).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prorl_bench.run.curve_rules import curve_summary

ROOT = Path(__file__).resolve().parents[1]
JSON = ROOT / "docs" / "data" / "prolonged_pilot.json"
FIGURE = ROOT / "docs" / "img" / "prolonged_pilot.png"
BIN = Path(sys.executable).parent
# the regime under test: sort_digits with 3-8 digit inputs, the tiny model, lr 1e-4 (regime v2's), 1,500 steps
REGIME = ["task.max_len=8", "steps=1500", "eval_every=100", "checkpoint.every=100"]
ARMS: dict[str, list[str]] = {
    "beta0": ["algo.beta=0"],
    "A1_beta0.1": ["algo.beta=0.1"],
    "A1_beta0.5": ["algo.beta=0.5"],
    "C_keep_every250_beta0.5": ["algo.beta=0.5", "variant=C", "reset=periodic", "reset.every=250"],
}
SHOW_STEPS = (0, 300, 500, 1000, 1500)


def _train(run_dir: Path, seed: int, extra: list[str], cache: Path) -> str:
    summary = run_dir / "summary.json"
    if summary.exists() and json.loads(summary.read_text()).get("status") == "completed":
        return f"{run_dir}: completed before"
    cmd = [str(BIN / "prorl-bench"), *REGIME, *extra, f"seed={seed}", f"run_dir={run_dir}", "progress=false",
           f"warmup.cache_dir={cache}", "hardware.torch_threads=1"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return f"{run_dir}: exit {proc.returncode}"


def run(out: Path, seeds: list[int]) -> None:
    cache = out / "base_cache"
    jobs = [(out / f"seed{s}" / arm, s, extra) for s in seeds for arm, extra in ARMS.items()]
    _train(*jobs[0][:3], cache)  # the base is trained once, before the parallel runs
    with ThreadPoolExecutor(2) as pool:
        for line in pool.map(lambda j: _train(*j, cache), jobs):
            print(line, flush=True)


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def report(out: Path, json_path: Path, figure: Path) -> None:
    runs = []
    for seed_dir in sorted(out.glob("seed*")):
        for arm in ARMS:
            d = seed_dir / arm
            if not (d / "summary.json").exists():
                continue
            summary = json.loads((d / "summary.json").read_text())
            if summary.get("status") != "completed":
                raise SystemExit(f"{d}: status {summary.get('status')!r}, not completed: finish it with `run` first")
            history, val = _rows(d / "metrics.jsonl"), _rows(d / "validation.jsonl")
            curve = curve_summary(history, val)
            runs.append({
                "arm": arm, "seed": int(seed_dir.name[4:]),
                "curve": [[v["step"], v["val/pass@1"]] for v in val],
                "resets": [r["step"] for r in history if r.get("reset")],
                "ms_per_step": 1000 * sum(r["time/step"] for r in history) / len(history),
                **{k: curve[k] for k in ("curve/plateaued", "curve/steps_to_plateau", "curve/slope_last",
                                         "curve/collapse_events", "curve/val_pass1_auc")},
                "provenance": summary.get("provenance", {}).get("bench", {}),
            })  # fmt: skip
    if not runs:
        raise SystemExit(f"{out}: no completed pilot runs (seed*/<arm>/summary.json)")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"regime": REGIME, "arms": ARMS, "runs": runs}, indent=1) + "\n")
    _figure(runs, figure)
    print(f"wrote {json_path} and {figure} ({len(runs)} runs)")


def _figure(runs: list[dict], figure: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = dict(zip(ARMS, ("tab:green", "tab:blue", "tab:red", "tab:purple"), strict=True))
    for r in runs:
        xs, ys = zip(*r["curve"], strict=True)
        label = r["arm"] if r["seed"] == min(x["seed"] for x in runs if x["arm"] == r["arm"]) else None
        ax.plot(xs, ys, color=colors[r["arm"]], alpha=0.85, lw=1.4, ls="-" if r["seed"] % 2 == 0 else "--", label=label)
        for s in r["resets"]:
            ax.axvline(s, color=colors[r["arm"]], alpha=0.15, lw=0.8)
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out pass@1 (128 prompts x 16 samples)")
    ax.set_title("Prolonged pilot: sort_digits 3-8, tiny, lr 1e-4 (solid seed 0, dashed seed 1; faint: resets)")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    figure.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(figure, dpi=110)


def markdown(json_path: Path) -> str:
    """The pilot table of docs/prolonged.md, from the committed JSON only."""
    data = json.loads(json_path.read_text())
    head = " | ".join(f"pass@1 @{s}" for s in SHOW_STEPS)
    lines = [f"| arm | seed | {head} | AUC | plateaued (step) | slope last 5 evals (per 1k steps) | collapse events "
             "| ms/step |", "|---" * (len(SHOW_STEPS) + 7) + "|"]  # fmt: skip
    for r in data["runs"]:
        at = dict((int(s), v) for s, v in r["curve"])
        cells = " | ".join(f"{at[s]:.3f}" if s in at else "–" for s in SHOW_STEPS)
        plat = f"yes ({r['curve/steps_to_plateau']})" if r["curve/plateaued"] else "no"
        if not r["curve/plateaued"] and r["curve/steps_to_plateau"] is not None:
            plat = f"no (first at {r['curve/steps_to_plateau']})"
        lines.append(f"| {r['arm']} | {r['seed']} | {cells} | {r['curve/val_pass1_auc']:.3f} | {plat} | "
                     f"{1000 * r['curve/slope_last']:+.3f} | {r['curve/collapse_events']} | {r['ms_per_step']:.0f} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p = sub.add_parser("report")
    p.add_argument("out", type=Path)
    p.add_argument("--json", type=Path, default=JSON)
    p.add_argument("--figure", type=Path, default=FIGURE)
    m = sub.add_parser("markdown")
    m.add_argument("--json", type=Path, default=JSON)
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.out, a.seeds)
    elif a.cmd == "report":
        report(a.out, a.json, a.figure)
    else:
        print(markdown(a.json))


if __name__ == "__main__":
    main()

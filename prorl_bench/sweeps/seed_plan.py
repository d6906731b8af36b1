"""The aggregator's "seeds for the next block" table: per primary cell of a finished block, how many
seeds (pairs) the next block needs to decide it at 80% power (prorl_bench/sweeps/power.py).

Input: the aggregator's comparisons table (one row per block x group x metric, with ``diff``, the
95% t interval ``lo``/``hi``, ``n``, ``paired``, ``family``, ``margin``). The sd of the per-seed
differences is recovered from the t interval (``power.sd_from_interval``); the family size is the
number of primary cells of that block (the Holm family the next block's verdict will use).
Unpaired primary cells get no plan (their verdict can never be ``equivalent`` and the planner's
formulas are for paired differences).
"""

from __future__ import annotations

import math

import pandas as pd

from prorl_bench.sweeps import power

COLUMNS = ["block", "group", "metric", "diff", "sd", "n", "family_size", "margin", "n_difference", "n_equivalence"]


def _n_text(n: float) -> str:
    return "not reachable" if n is None or not math.isfinite(n) else str(int(n))


def seed_plan(comparisons: pd.DataFrame) -> pd.DataFrame:
    """One row per paired primary cell: observed diff, sd, n, family size, and the planned n for each
    decision (nan: no n up to ``power.MAX_N`` reaches 80% power at the observed effect)."""
    if comparisons.empty or "family" not in comparisons:
        return pd.DataFrame(columns=COLUMNS)
    prim = comparisons[(comparisons["family"] == "primary") & comparisons["paired"].astype(bool)]
    rows = []
    for block, cells in prim.groupby("block" if "block" in prim else lambda _: "", sort=False):
        family = int(cells["p"].notna().sum())
        for _, c in cells.iterrows():
            if not (c["n"] >= 2 and math.isfinite(c["diff"])):
                continue
            sd = power.sd_from_interval(c["lo"], c["hi"], int(c["n"]))
            if not math.isfinite(sd):
                sd = 0.0 if c["lo"] == c["hi"] else sd  # identical differences: a zero-width interval
            margin = c["margin"] if math.isfinite(c["margin"]) else None
            plan = power.plan_cell(float(c["diff"]), sd, int(c["n"]), max(family, 1), margin)
            rows.append({
                "block": block, "group": c["group"], "metric": c["metric"], "diff": plan.diff, "sd": plan.sd,
                "n": plan.n, "family_size": plan.family, "margin": margin if margin is not None else math.nan,
                "n_difference": plan.n_difference if plan.n_difference is not None else math.nan,
                "n_equivalence": plan.n_equivalence if plan.n_equivalence is not None else math.nan,
            })  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def seed_plan_markdown(plan: pd.DataFrame) -> str:
    """The printed section: per block, per primary cell, the seeds the next block needs."""
    if plan.empty:
        return ""
    lines = [
        "### Seeds for the next block (80% power, from this block's paired variance)",
        "",
        "Per primary cell: the observed Δ and sd of the per-seed differences over n pairs, and the seeds per arm a "
        "new block needs to call the cell `different` (two-sided paired t at α/m, power from the noncentral t) or "
        "`equivalent within ±margin` (TOST at α/m, exact power integrated over the sample sd), m = the block's "
        "primary family. Planning assumes the observed Δ and sd are the truth: a Δ near 0 needs very many seeds "
        "to be called different; a Δ at or beyond the margin can never be called equivalent. "
        "prorl_bench/sweeps/power.py states the formulas.",
        "",
        "| block | group | endpoint | Δ | sd | n | m | seeds: different | seeds: equivalent |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in plan.iterrows():
        equiv = _n_text(r["n_equivalence"]) if math.isfinite(r["margin"]) else "no margin"
        lines.append(
            f"| {r['block']} | {r['group']} | {r['metric']} | {r['diff']:+.4f} | {r['sd']:.4f} | {int(r['n'])} "
            f"| {int(r['family_size'])} | {_n_text(r['n_difference'])} | {equiv} |"
        )
    return "\n".join(lines + [""])

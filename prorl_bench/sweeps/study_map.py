"""A study map: one declared study run in several strata (reset_map: lr x cadence x model size), each
stratum its own sweep with its own baseline and Holm family, read together into one table and figure.

Layout (what ``sweeps/sweep/reset_map.yaml`` writes): ``ROOT/<stratum>/<block>/<date>/`` with
``<block>`` in explore / confirm. Per stratum the newest sweep of each block is aggregated exactly as
``prorl-bench-aggregate EXPLORE CONFIRM`` would (``aggregate.aggregate``: tables, seed plan, into
``ROOT/<stratum>/aggregate``), and its primary cells are collected: one row per stratum x arm x
endpoint x block with Δ, the 95% t interval, n, the verdict and — with both blocks — the replication
verdict (``stats.replication``). A stratum with one block only is shown, marked "one block".

    prorl-bench-map outputs/sweeps/reset_map                   # table + docs-style figure
    prorl-bench-map outputs/sweeps/reset_map --figure docs/img/reset_map.png
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from prorl_bench.config.study import REQUIRED_BLOCKS
from prorl_bench.sweeps import stats
from prorl_bench.sweeps.aggregate import aggregate
from prorl_bench.sweeps.markdown import fmt_value, markdown_table
from prorl_bench.sweeps.sweepdir import SweepDirError

COLUMNS = [
    "stratum", "group", "metric", "block", "diff", "lo", "hi", "n", "margin", "verdict", "direction", "replication",
]  # fmt: skip
VERDICT_COLOURS = {"worse": "#c0392b", "better": "#27ae60", "equivalent": "#2e86c1", "undecided": "#95a5a6"}


def verdict_word(verdict: str, diff: float, direction: str) -> str:
    """worse / better / equivalent / undecided: a ``different`` verdict worded by the endpoint's direction."""
    if verdict != stats.DIFFERENT:
        return verdict or stats.UNDECIDED
    higher_is_better = direction != "lower"
    return "better" if (diff > 0) == higher_is_better else "worse"


def newest_sweeps(stratum: Path) -> dict[str, Path]:
    """block -> the newest sweep directory (by name: dates sort) of that block in ``stratum``."""
    found = {}
    for block in REQUIRED_BLOCKS:
        dated = sorted(p for p in (stratum / block).glob("*") if p.is_dir()) if (stratum / block).is_dir() else []
        if dated:
            found[block] = dated[-1]
    return found


def stratum_cells(stratum: str, comparisons: pd.DataFrame) -> pd.DataFrame:
    """The primary cells of one stratum's comparisons, with the replication verdict when both blocks exist."""
    if comparisons.empty or "family" not in comparisons:
        return pd.DataFrame(columns=COLUMNS)
    prim = comparisons[comparisons["family"] == "primary"].copy()
    prim.insert(0, "stratum", stratum)
    prim["replication"] = ""
    for (_, _), g in prim.groupby(["group", "metric"], sort=False):
        by_block = {r["block"]: r for _, r in g.iterrows()}
        if all(b in by_block for b in REQUIRED_BLOCKS):
            e, c = by_block["explore"], by_block["confirm"]
            prim.loc[g.index, "replication"] = stats.replication(e["verdict"], e["diff"], c["verdict"], c["diff"])
        else:
            prim.loc[g.index, "replication"] = "one block"
    return prim[COLUMNS]


def collect(root: Path, figures: bool = False) -> pd.DataFrame:
    """Aggregate every stratum under ``root`` (its newest explore and confirm sweeps) and return the map table."""
    strata = sorted(p for p in Path(root).iterdir() if p.is_dir() and newest_sweeps(p))
    if not strata:
        raise SweepDirError(f"{root}: no <stratum>/explore|confirm/<date> sweep directories")
    parts = []
    for stratum in strata:
        dirs = newest_sweeps(stratum)
        res = aggregate([dirs[b] for b in REQUIRED_BLOCKS if b in dirs], out_dir=stratum / "aggregate", figures=figures)
        if res.study is None:
            raise SweepDirError(f"{stratum}: no declared study (or its baseline is missing): a map needs verdicts")
        _refuse_unfinished(stratum, dirs, res.runs)
        cells = stratum_cells(stratum.name, res.comparisons)
        if cells.empty:
            found = sorted(map(str, dirs.values()))
            raise SweepDirError(f"{stratum}: no primary cells in {found}: a map needs verdicts")
        parts.append(cells)
    return pd.concat(parts, ignore_index=True)


UNFINISHED = ("incomplete", "missing", "preempted")  # a sweep still running or stopped: its verdicts would change


def _refuse_unfinished(stratum: Path, dirs: dict[str, Path], runs: pd.DataFrame) -> None:
    """A stratum whose newest sweeps still have runs to finish is refused, naming them: leaving it out, or
    drawing verdicts from its finished seeds alone, would present a partial map as the map. Failed runs
    are a finished outcome (counted by the aggregator's n) and pass."""
    if runs.empty or "status" not in runs:
        return
    counts = runs["status"].value_counts()
    open_ = {s: int(counts[s]) for s in UNFINISHED if s in counts}
    if open_:
        said = ", ".join(f"{n} {s}" for s, n in open_.items())
        raise SweepDirError(
            f"{stratum}: {said} of {len(runs)} runs in {sorted(map(str, dirs.values()))} (a sweep still running or "
            "stopped): finish it (prorl-bench-sweep --resume DIR) or move it out of the root before drawing the map"
        )


def map_markdown(cells: pd.DataFrame) -> str:
    """One row per stratum x arm x endpoint: each block's Δ [95% CI] → verdict (n), and the replication."""
    rows = []
    for (stratum, group, metric), g in cells.groupby(["stratum", "group", "metric"], sort=False):
        row = [stratum, group, metric]
        for block in REQUIRED_BLOCKS:
            c = g[g["block"] == block]
            if c.empty:
                row.append("not run")
                continue
            r = c.iloc[0]
            word = verdict_word(r["verdict"], r["diff"], r["direction"])
            row.append(
                f"{fmt_value(r['diff'])} [{fmt_value(r['lo'])}, {fmt_value(r['hi'])}] → {word} (n={int(r['n'])})"
            )
        row.append(g.iloc[0]["replication"])
        rows.append(row)
    return markdown_table(["stratum", "arm", "endpoint", "explore", "confirm", "replication"], rows)


def _split_name(stratum: str) -> list[tuple[str, float | None, str]]:
    """``lr0.001_every10_d64`` -> [("lr", 0.001, "lr0.001"), ("every", 10.0, "every10"), ("d", 64.0, "d64")]:
    each ``_``-separated token's letters, its number (None if it has none) and the token."""
    out: list[tuple[str, float | None, str]] = []
    for tok in stratum.split("_"):
        m = re.fullmatch(r"([A-Za-z]*)(.*)", tok)
        head, rest = (m.group(1), m.group(2)) if m else (tok, "")
        try:
            out.append((head, float(rest), tok))
        except ValueError:
            out.append((tok, None, tok))
    return out


def strata_layout(strata: Sequence[str]) -> dict[str, tuple[int, int, int]] | None:
    """Panels for strata named as the study's sweep directory names them (``lr<x>_every<y>_d<z>``): the
    first token is the x axis inside a panel, the second the panel column, the rest the panel row, each
    ordered by its number. None when the names do not share one token pattern (one row is drawn then)."""
    parsed = {s: _split_name(s) for s in strata}
    shapes = {tuple(h for h, _, _ in p) for p in parsed.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) < 2:
        return None

    def order(values: set[tuple]) -> list[tuple]:
        return sorted(values, key=lambda v: tuple((n is None, n if n is not None else 0.0, t) for _, n, t in v))

    xs = order({(p[0],) for p in parsed.values()})
    cols = order({(p[1],) for p in parsed.values()})
    rows = order({tuple(p[2:]) for p in parsed.values()})
    return {s: (rows.index(tuple(p[2:])), cols.index((p[1],)), xs.index((p[0],))) for s, p in parsed.items()}


def _draw_cells(ax, cells: pd.DataFrame, strata: list[str], slots: list[int], arms: list[str], n_x: int) -> None:
    """Each stratum at its x slot, its arms side by side, explore (circle) and confirm (square) with their
    intervals, coloured by verdict, filled when replicated."""
    width = 0.8 / max(1, len(arms))
    for stratum, i in zip(strata, slots):
        for j, arm in enumerate(arms):
            for b, (block, marker) in enumerate(zip(REQUIRED_BLOCKS, ("o", "s"))):
                c = cells[(cells["stratum"] == stratum) & (cells["group"] == arm) & (cells["block"] == block)]
                if c.empty:
                    continue
                r = c.iloc[0]
                x = i - 0.4 + width * (j + 0.5) + (b - 0.5) * width * 0.35
                colour = VERDICT_COLOURS[verdict_word(r["verdict"], r["diff"], r["direction"])]
                filled = str(r["replication"]).startswith("replicated")
                ax.errorbar(x, r["diff"], yerr=[[r["diff"] - r["lo"]], [r["hi"] - r["diff"]]], color=colour, lw=1.2)
                ax.plot(x, r["diff"], marker=marker, ms=6, color=colour, mfc=colour if filled else "white", mew=1.4)
    ticks = [(i - 0.4 + width * (j + 0.5), arm) for i in sorted(set(slots)) for j, arm in enumerate(arms)]
    ax.set_xticks([t for t, _ in ticks], [a for _, a in ticks], fontsize=7, rotation=90)
    for i in range(1, n_x):
        ax.axvline(i - 0.5, color="grey", lw=0.5)
    ax.axhline(0, color="black", lw=0.8)


def map_figure(cells: pd.DataFrame, margin: float | None, path: Path, title: str) -> Path:
    """Δ vs baseline per stratum and arm, explore (circle) and confirm (square) with their 95% t
    intervals, coloured by verdict; filled = replicated, hollow = not (or one block); ±margin shaded.
    Strata named by one token pattern (``lr<x>_every<y>_d<z>``) are drawn as a grid of panels (rows: the
    third token on, columns: the second, x inside a panel: the first); other names in one row."""
    import matplotlib

    matplotlib.use("agg")
    import matplotlib.pyplot as plt

    strata = list(dict.fromkeys(cells["stratum"]))
    arms = list(dict.fromkeys(cells["group"]))
    grid = strata_layout(strata)
    layout = grid or {s: (0, 0, i) for i, s in enumerate(strata)}
    n_rows = 1 + max(r for r, _, _ in layout.values())
    n_cols = 1 + max(c for _, c, _ in layout.values())
    n_x = 1 + max(x for _, _, x in layout.values())
    width_in = max(7.0, n_cols * (1.1 * n_x * len(arms) / 3 + 1.2) + 1.6)  # ~1.1 in per stratum of 3 arms
    fig, axes = plt.subplots(
        n_rows, n_cols, squeeze=False, sharey=True, constrained_layout=True, figsize=(width_in, 3.4 * n_rows + 0.6)
    )
    for r in range(n_rows):
        for c in range(n_cols):
            ax = axes[r][c]
            here = [s for s, (rr, cc, _) in layout.items() if (rr, cc) == (r, c)]
            if margin is not None:
                ax.axhspan(-margin, margin, color="#d6eaf8", alpha=0.6, lw=0)
            if not here:  # a cell of the grid with no stratum: said, not left blank
                ax.set_xticks([])
                ax.text(0.5, 0.5, "not run", transform=ax.transAxes, ha="center", va="center", color="grey")
                continue
            slots = [layout[s][2] for s in here]
            _draw_cells(ax, cells, here, slots, arms, n_x)
            ax.set_xlim(-0.5, n_x - 0.5)
            # under its arms: the x token (lr...) in a grid, the whole stratum name in one row
            tokens = {layout[s][2]: _split_name(s)[0][2] if grid else s for s in here}
            for i, tok in tokens.items():
                ax.annotate(tok, (i, 0), xycoords=("data", "axes fraction"), xytext=(0, -52),
                            textcoords="offset points", ha="center", va="top", fontsize=8, weight="bold")  # fmt: skip
            if grid:
                ax.set_title(" · ".join(t for _, _, t in _split_name(here[0])[1:]), fontsize=9)
            if c == 0:
                ax.set_ylabel(f"Δ {cells['metric'].iloc[0]} vs baseline\n(95% t interval)", fontsize=8)
    fig.suptitle(title, fontsize=10)
    handles = [plt.Line2D([], [], ls="", marker="o", color=c, label=v) for v, c in VERDICT_COLOURS.items()]
    handles += [
        plt.Line2D([], [], ls="", marker="o", color="black", label="explore block"),
        plt.Line2D([], [], ls="", marker="s", color="black", label="confirm block"),
        plt.Line2D([], [], ls="", marker="o", color="black", mfc="white", label="hollow: not replicated / one block"),
    ]
    if margin is not None:
        handles.append(plt.Rectangle((0, 0), 1, 1, color="#d6eaf8", label=f"±{fmt_value(margin)} (margin)"))
    fig.legend(handles=handles, fontsize=7, loc="outside right center")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``prorl-bench-map ROOT [--figure PNG] [--metric M]``: the map table (printed, map.md, map.csv), figure."""
    p = argparse.ArgumentParser(prog="prorl-bench-map", description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, help="a study's strata directory, e.g. outputs/sweeps/reset_map")
    p.add_argument("--figure", type=Path, default=None, help="figure path (default ROOT/map.png)")
    p.add_argument("--metric", default=None, help="primary endpoint drawn in the figure (default: the first)")
    args = p.parse_args(argv)
    try:
        cells = collect(args.root)
    except (SweepDirError, FileNotFoundError) as e:
        print(f"prorl-bench-map: {e}", file=sys.stderr)
        return 2
    md = map_markdown(cells)
    (args.root / "map.md").write_text(md + "\n")
    cells.to_csv(args.root / "map.csv", index=False)
    metric = args.metric or cells["metric"].iloc[0]
    drawn = cells[cells["metric"] == metric]
    if drawn.empty:
        print(f"prorl-bench-map: no primary cells for --metric {metric}; endpoints: {sorted(set(cells['metric']))}",
              file=sys.stderr)  # fmt: skip
        return 2
    margins = drawn["margin"].dropna()
    margin = float(margins.iloc[0]) if not margins.empty else None
    fig = map_figure(drawn, margin, args.figure or args.root / "map.png", f"{args.root.name}: Δ {metric} vs baseline")
    print(md)
    print(f"[prorl-bench-map] table: {args.root}/map.md, map.csv; figure: {fig}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``prorl-bench-report SWEEP_DIR [SWEEP_DIR ...]``: aggregate the sweep(s) and write the self-contained
HTML report (report.py) next to the tables; print its path."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from prorl_bench.sweeps.aggregate import OUT_SUBDIR, aggregate
from prorl_bench.sweeps.sweepdir import SweepDirError


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="prorl-bench-report", description=__doc__.splitlines()[0])
    p.add_argument(
        "sweep_dir", type=Path, nargs="+",
        help="Hydra multirun directories; two (an explore and a confirm block) show both blocks side by side",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help=f"output directory (default FIRST_SWEEP_DIR/{OUT_SUBDIR})")
    p.add_argument("--baseline", default=None, help="group to compare against (default: the study's, A1, keep)")
    p.add_argument("--no-figures", action="store_true", help="tables only (no figures drawn or inlined)")
    args = p.parse_args(argv)
    try:
        res = aggregate(args.sweep_dir, args.out, figures=not args.no_figures, baseline=args.baseline)
    except SweepDirError as e:
        print(f"prorl-bench-report: {e}", file=sys.stderr)
        return 2
    for w in res.provenance_warnings:
        print(f"prorl-bench-report: WARNING: {w}", file=sys.stderr)
    print(f"[prorl-bench-report] report: {res.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

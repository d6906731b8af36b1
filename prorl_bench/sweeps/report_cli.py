"""``prorl-bench-report``: the HTML report of a sweep, a study's compact summary, or docs/results.md.

prorl-bench-report SWEEP_DIR [SWEEP_DIR ...]                  # the self-contained HTML report
prorl-bench-report --summary OUT.json EXPLORE_DIR CONFIRM_DIR  # a study's compact summary (committable)
prorl-bench-report --docs [--summaries DIR] [--out FILE] [--check]   # docs/results.md from the summaries
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from prorl_bench.sweeps.aggregate import OUT_SUBDIR, aggregate
from prorl_bench.sweeps.study_summary import SummaryError, build_summary, write_summary
from prorl_bench.sweeps.sweepdir import SweepDirError

PROG = "prorl-bench-report"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument(
        "sweep_dir", type=Path, nargs="*",
        help="Hydra multirun directories; two (an explore and a confirm block) show both blocks side by side",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=None,
                   help=f"output directory (default FIRST_SWEEP_DIR/{OUT_SUBDIR}); with --docs the page "
                        "(default docs/results.md)")  # fmt: skip
    p.add_argument("--baseline", default=None, help="group to compare against (default: the study's, A1, keep)")
    p.add_argument("--no-figures", action="store_true", help="tables only (no figures drawn or inlined)")
    p.add_argument(
        "--summary",
        type=Path,
        default=None,
        metavar="OUT.json",
        help="write the study's compact summary (per-seed endpoint values and provenance) to OUT.json",
    )
    p.add_argument(
        "--name", default=None, help="with --summary: the study's name (default: the +sweep= of its command)"
    )
    p.add_argument(
        "--stratum",
        default=None,
        help="with --summary: the stratum's label, for a stratum its command does not name (a sweep file that "
        "fixes beta=0.5 itself); default: the operating-point overrides of its command",
    )
    p.add_argument("--docs", action="store_true", help="generate docs/results.md from the committed study summaries")
    p.add_argument(
        "--summaries", type=Path, default=Path("docs/data/studies"), help="with --docs: the summaries' folder"
    )
    p.add_argument("--check", action="store_true", help="with --docs: write nothing; exit 1 if the page differs")
    return p


def _docs(args: argparse.Namespace) -> int:
    from prorl_bench.sweeps.results_doc import results_markdown

    if not args.summaries.is_dir():
        print(f"{PROG}: --summaries {args.summaries}: no such folder", file=sys.stderr)
        return 2
    text = results_markdown(args.summaries)
    out = args.out or Path("docs/results.md")
    if args.check:
        same = out.exists() and out.read_text() == text
        print(f"[{PROG}] {out}: {'up to date' if same else 'differs from what the summaries give'}")
        return 0 if same else 1
    out.write_text(text)
    print(f"[{PROG}] wrote {out} from {len(list(args.summaries.glob('*.json')))} summaries")
    return 0


def _summary(args: argparse.Namespace) -> int:
    """The compact summary only: the tables it needs are made in a temporary folder, so the sweeps'
    own aggregate (its figures and HTML report) is left as it is."""
    with tempfile.TemporaryDirectory() as tmp:
        res = aggregate(args.sweep_dir, Path(tmp), figures=False, baseline=args.baseline)
        for w in res.provenance_warnings:
            print(f"{PROG}: WARNING: {w}", file=sys.stderr)
        path = write_summary(build_summary(res, args.name, args.stratum), args.summary)
    print(f"[{PROG}] summary: {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.docs:
            return _docs(args)
        if not args.sweep_dir:
            print(f"{PROG}: give at least one SWEEP_DIR (or --docs)", file=sys.stderr)
            return 2
        if args.summary is not None:
            return _summary(args)
        res = aggregate(args.sweep_dir, args.out, figures=not args.no_figures, baseline=args.baseline)
        for w in res.provenance_warnings:
            print(f"{PROG}: WARNING: {w}", file=sys.stderr)
    except (SweepDirError, SummaryError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    print(f"[{PROG}] report: {res.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

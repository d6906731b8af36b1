"""``prorl-bench-sweep ARGS``: ``prorl-bench -m ARGS``, then the comparison table — even if jobs failed.

Hydra remains the engine (sweeper, launcher, run directories); this wrapper only covers the case
Hydra leaves open: when any job raises, Hydra skips ``on_multirun_end`` (so no table) and exits
non-zero. The multirun runs as a child process; ``AggregateCallback.on_multirun_start`` tells us the
sweep directory through a temporary file; if the multirun failed we aggregate that directory here.
The exit status is the multirun's, so scripts still see failures.

    prorl-bench-sweep +sweep=ablation_small            # grid from sweeps/sweep/ablation_small.yaml
    prorl-bench-sweep +sweep=ablation seed=0,1 steps=50 # any knob overridden on the same line
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from prorl_bench.aggregate import SWEEP_DIR_FILE_ENV, aggregate, print_result
from prorl_bench.sweepdir import SweepDirError


def run_sweep(args: Sequence[str]) -> tuple[int, Path | None]:
    """Run ``prorl-bench -m ARGS`` in a child process; return (exit status, sweep dir or None)."""
    with tempfile.TemporaryDirectory(prefix="prorl-sweep-") as tmp:
        marker = Path(tmp) / "sweep_dir"
        env = {**os.environ, SWEEP_DIR_FILE_ENV: str(marker)}
        cmd = [sys.executable, "-m", "prorl_bench.app", "-m", *args]
        rc = subprocess.call(cmd, env=env)
        sweep_dir = Path(marker.read_text().strip()) if marker.is_file() else None
    return rc, sweep_dir


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    rc, sweep_dir = run_sweep(args)
    if rc == 0:
        return 0  # the callback already printed the table and wrote the figures
    if sweep_dir is None:
        print(
            f"prorl-bench-sweep: the multirun failed before starting (exit {rc}); nothing to aggregate", file=sys.stderr
        )
        return rc
    print(f"prorl-bench-sweep: some jobs failed (exit {rc}); aggregating {sweep_dir}", file=sys.stderr)
    try:
        print_result(aggregate(sweep_dir))
    except SweepDirError as e:
        print(f"prorl-bench-sweep: {e}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())

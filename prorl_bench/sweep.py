"""``prorl-bench-sweep ARGS``: ``prorl-bench -m ARGS``, then the comparison table — even if jobs failed.

Hydra remains the engine (sweeper, launcher, run directories); this wrapper covers what Hydra
leaves open:

* every job of the grid is composed and validated *before the first one starts* (a bad value in
  an ad-hoc grid fails at once, naming the job, and nothing is written); ``--dry-run`` lists the
  jobs and validates them without running anything;
* when any job raises, Hydra skips ``on_multirun_end`` (so no table) and exits non-zero: the
  multirun runs as a child process, ``AggregateCallback.on_multirun_start`` tells us the sweep
  directory through a temporary file, and we aggregate that directory here;
* when the launcher itself fails before any job ran, its error is shown — not a table of
  "missing" rows;
* SIGTERM / SIGINT (to this process or its whole process group): the sweep stops — running jobs
  checkpoint and end ``preempted``, unstarted jobs do not start — the table is printed, and the
  exit status is 128 + the signal number; re-running the same command resumes.

Hydra's own informational flags (``--cfg``, ``--info``, ``-sc``/``--shell-completion``,
``--hydra-help``, ``--resolve``, ``--package``) are passed to ``prorl-bench`` as they are.
The exit status is the multirun's, so scripts still see failures.

    prorl-bench-sweep +sweep=ablation_small            # grid from sweeps/sweep/ablation_small.yaml
    prorl-bench-sweep +sweep=ablation seed=0,1 steps=50 # any knob overridden on the same line
    prorl-bench-sweep +sweep=ablation --dry-run         # the jobs, validated, nothing run
    prorl-bench-sweep ... --no-validate                 # skip the up-front check (bad jobs fail when run)
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from prorl_bench.aggregate import SWEEP_DIR_FILE_ENV, aggregate, print_result
from prorl_bench.sweepdir import SweepDirError

# Hydra flags that print something instead of running (one of them makes a multirun meaningless)
INFO_FLAGS = {
    "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc", "--hydra-help", "--resolve", "--package", "-p",
}  # fmt: skip
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def plan_jobs(args: Sequence[str]) -> list[list[str]]:
    """The override list of every job the multirun would launch (the grid's ``hydra.sweeper.params``
    combined with the command line, as Hydra's basic sweeper expands them)."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from prorl_bench.config import register_configs
    from prorl_bench.searchpath import CONF_DIR

    register_configs()
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(list(args))
    plain = [o.input_line for o in parsed if not o.is_sweep_override()]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=plain, return_hydra_config=True)
    params = cfg.hydra.sweeper.get("params") or {}
    grid = [f"{k}={v}" for k, v in params.items()]
    return BasicSweeper.split_arguments(parser.parse_overrides(grid + list(args)), None)[0]


def validate_jobs(jobs: Sequence[Sequence[str]]) -> list[tuple[list[str], str]]:
    """(job overrides, error) for every job whose config does not compose or validate."""
    from hydra import compose, initialize_config_dir

    from prorl_bench.config import to_config
    from prorl_bench.searchpath import CONF_DIR

    errors: list[tuple[list[str], str]] = []
    seen: dict[tuple[str, ...], str | None] = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for job in jobs:
            key = tuple(o for o in job if not o.startswith("hydra"))  # launcher knobs do not change a job
            if key not in seen:
                try:
                    to_config(compose(config_name="config", overrides=list(key)))
                    seen[key] = None
                except Exception as e:  # ConfigError, Hydra's composition errors, OmegaConf's type errors
                    seen[key] = f"{type(e).__name__}: {e}".splitlines()[0]
            if seen[key] is not None:
                errors.append((list(job), seen[key]))
    return errors


class _Child:
    """The multirun child; its stderr is passed through and its last lines kept (launcher errors)."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, errors="replace")
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self._pump = threading.Thread(target=self._forward, daemon=True)
        self._pump.start()

    def _forward(self) -> None:
        for line in self.proc.stderr:
            sys.stderr.write(line)
            self.tail.append(line.rstrip("\n"))

    def wait(self) -> int:
        while True:
            try:
                rc = self.proc.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handlers below turn SIGINT into a flag
                continue
        self._pump.join(timeout=5)
        return rc


def run_sweep(args: Sequence[str]) -> tuple[int, Path | None, list[str], int | None]:
    """Run ``prorl-bench -m ARGS`` in a child process. Returns (exit status, sweep dir or None, the
    last lines of its stderr, the stop signal received or None)."""
    received: list[int] = []
    with tempfile.TemporaryDirectory(prefix="prorl-sweep-") as tmp:
        marker = Path(tmp) / "sweep_dir"
        env = {**os.environ, SWEEP_DIR_FILE_ENV: str(marker)}
        child = _Child([sys.executable, "-m", "prorl_bench.app", "-m", *args], env)

        def forward(signum: int, frame: object) -> None:
            # the child stops its sweep (see aggregate.AggregateCallback); we wait for it and report
            received.append(signum)
            if child.proc.poll() is None:
                child.proc.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
        try:
            rc = child.wait()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
        sweep_dir = Path(marker.read_text().strip()) if marker.is_file() else None
    return rc, sweep_dir, list(child.tail), (received[0] if received else None)


def _jobs_started(sweep_dir: Path) -> bool:
    """Whether any job of the sweep began its run (Hydra writes a job's .hydra/ before running it)."""
    return any(p.is_dir() for p in sweep_dir.rglob(".hydra"))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    if any(a.split("=")[0] in INFO_FLAGS for a in args):  # Hydra prints; there is nothing to sweep
        return subprocess.call([sys.executable, "-m", "prorl_bench.app", *args])
    from prorl_bench import preflight  # TRL / verl names and typos, SLURM without SLURM: before Hydra

    problem = preflight.names_problem(args, "prorl-bench-sweep") or preflight.slurm_problem(args, "prorl-bench-sweep")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    dry_run, check = "--dry-run" in args, "--no-validate" not in args
    args = [a for a in args if a not in ("--dry-run", "--no-validate")]
    if not check:
        return _launch(args)
    try:
        jobs = plan_jobs(args)
    except Exception as e:
        print(f"prorl-bench-sweep: the grid does not compose: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    errors = validate_jobs(jobs)
    for job, error in errors:
        print(f"prorl-bench-sweep: invalid job [{' '.join(job)}]: {error}", file=sys.stderr)
    if errors:
        print(f"prorl-bench-sweep: {len(errors)} of {len(jobs)} jobs are invalid; nothing was run", file=sys.stderr)
        return 2
    if dry_run:
        for i, job in enumerate(jobs):
            print(f"#{i} {' '.join(job)}")
        print(f"prorl-bench-sweep: {len(jobs)} jobs, all valid (dry run: nothing was run)")
        return 0
    return _launch(args)


def _launch(args: list[str]) -> int:
    rc, sweep_dir, tail, stopped = run_sweep(args)
    if stopped is not None:
        rc = 128 + stopped
    if rc == 0:
        return 0  # the callback already printed the table and wrote the figures
    if sweep_dir is None or not _jobs_started(sweep_dir):
        where = "before starting" if sweep_dir is None else f"before any job ran (sweep dir {sweep_dir})"
        print(f"prorl-bench-sweep: the multirun failed {where}, exit {rc}; its error:", file=sys.stderr)
        print("\n".join("    " + line for line in tail[-12:]) or "    (no output)", file=sys.stderr)
        return rc
    why = f"stopped by {signal.Signals(stopped).name}" if stopped is not None else "some jobs failed"
    print(f"prorl-bench-sweep: {why} (exit {rc}); aggregating {sweep_dir}", file=sys.stderr)
    try:
        print_result(aggregate(sweep_dir))
    except SweepDirError as e:
        print(f"prorl-bench-sweep: {e}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())

"""``prorl-bench-sweep ARGS``: ``prorl-bench -m ARGS``, then the comparison table — even if jobs failed.

Hydra remains the engine (sweeper, launcher, run directories); this wrapper covers what Hydra
leaves open:

* every job of the grid is composed and validated *before the first one starts* (a bad value in
  an ad-hoc grid fails at once, naming the job, and nothing is written); ``--dry-run`` lists the
  jobs and validates them without running anything;
* when any job raises, Hydra skips ``on_multirun_end`` (so no table) and exits non-zero: the
  multirun runs as a child process, ``callback.AggregateCallback.on_multirun_start`` tells us the sweep
  directory through a temporary file, and we aggregate that directory here;
* when the launcher itself fails before any job ran, its error is shown — not a table of
  "missing" rows;
* SIGTERM / SIGINT (to this process or its whole process group): the sweep stops — running jobs
  checkpoint and end ``preempted``, unstarted jobs do not start — the table is printed, and the
  exit status is 128 + the signal number; the last line is the command that finishes it:
  ``prorl-bench-sweep --resume SWEEP_DIR`` (completed jobs are skipped and left untouched,
  preempted ones resume from their checkpoints, the others run; then the table covers all);
* progress: a line whenever a job starts or ends and every minute while jobs run (jobs done /
  running / failed / waiting, RL steps, ETA: ``sweepwatch.py``); ``progress=false`` turns it off.

Hydra's own informational flags (``--cfg``, ``--info``, ``-sc``/``--shell-completion``,
``--hydra-help``, ``--resolve``, ``--package``) are passed to ``prorl-bench`` as they are.
The exit status is the multirun's, so scripts still see failures.

    prorl-bench-sweep +sweep=ablation_small            # grid from sweeps/sweep/ablation_small.yaml
    prorl-bench-sweep +sweep=ablation seed=0,1 steps=50 # any knob overridden on the same line
    prorl-bench-sweep +sweep=ablation --dry-run         # the jobs, validated, nothing run
    prorl-bench-sweep ... --no-validate                 # skip the up-front check (bad jobs fail when run)
    prorl-bench-sweep --resume outputs/sweeps/ablation/2026-01-01_12-00-00   # finish a stopped sweep in place
    prorl-bench-sweep --resume DIR hydra.launcher.n_jobs=4                    # ... with other launcher settings
"""

from __future__ import annotations

import collections
import copy
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prorl_bench.run import provenance
from prorl_bench.run.signals import STOP_FILE, write_stop_file
from prorl_bench.sweeps.callback import SWEEP_DIR_FILE_ENV
from prorl_bench.sweeps.sweepdir import SweepDirError, recorded_command, recorded_figures
from prorl_bench.sweeps.sweepwatch import SweepWatch, scan

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


_SEED = re.compile(r"seed=-?[0-9]+")  # a plain integer seed override (not +seed, not a sweep)


def validate_jobs(jobs: Sequence[Sequence[str]]) -> list[tuple[list[str], str]]:
    """(job overrides, error) for every job whose config does not compose or validate.

    Jobs that differ only in an integer ``seed=N`` share one composition: the seed is set on a copy of
    the composed config, as the override would set it (a leaf of the schema, after every default), and
    the copy is validated. A 16-seed grid composes 16 times fewer; the verdicts are those of composing
    each job (tested)."""
    from hydra import compose, initialize_config_dir

    from prorl_bench.cli.option_code import load_option_code
    from prorl_bench.config import to_config
    from prorl_bench.searchpath import CONF_DIR

    load_option_code()  # validated as each job's run validates it
    errors: list[tuple[list[str], str]] = []
    composed: dict[tuple[str, ...], Any] = {}
    seen: dict[tuple[str, ...], str | None] = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for job in jobs:
            key = tuple(o for o in job if not o.startswith("hydra"))  # launcher knobs do not change a job
            if key not in seen:
                seed = [o for o in key if _SEED.fullmatch(o)]
                rest = tuple(o for o in key if o not in seed) if len(seed) == 1 else key
                try:
                    if rest not in composed:
                        composed[rest] = compose(config_name="config", overrides=list(rest))
                    cfg = composed[rest]
                    if rest != key:
                        cfg = copy.deepcopy(cfg)  # the shared composition stays as composed
                        cfg.seed = int(seed[0].split("=", 1)[1])
                    to_config(cfg)
                    seen[key] = None
                except Exception as e:  # ConfigError, Hydra's composition errors, OmegaConf's type errors
                    seen[key] = f"{type(e).__name__}: {e}".splitlines()[0]
            if seen[key] is not None:
                errors.append((list(job), seen[key]))
    return errors


class _Child:
    """The multirun child; its stderr is passed through and its last lines kept (launcher errors)."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stderr=subprocess.PIPE, text=True, errors="replace")
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


def run_sweep(
    args: Sequence[str], cwd: Path | None = None, n_jobs: int | None = None
) -> tuple[int, Path | None, list[str], int | None]:
    """Run ``prorl-bench -m ARGS`` in a child process (in ``cwd``). Returns (exit status, sweep dir or
    None, the last lines of its stderr, the stop signal received or None). Unless ``progress=false``
    is among ARGS, a ``SweepWatch`` reports the jobs (``n_jobs``: the grid's size, when known)."""
    received: list[int] = []
    with tempfile.TemporaryDirectory(prefix="prorl-sweep-") as tmp:
        marker = Path(tmp) / "sweep_dir"
        env = {**os.environ, SWEEP_DIR_FILE_ENV: str(marker)}
        child = _Child([sys.executable, "-m", "prorl_bench.cli.app", "-m", *args], env, cwd)
        watch = None if _progress_off(args) else SweepWatch(lambda: _read_marker(marker), n_jobs).start()

        def forward(signum: int, frame: object) -> None:
            # the child stops its sweep (see callback.AggregateCallback); we wait for it and report.
            # Once the sweep directory is known, stop it through its STOP file, not a second signal: a
            # Ctrl-C at a terminal has already reached the child (same process group), and a second
            # SIGINT would abort its running job ("Ctrl-C again") instead of preempting it.
            received.append(signum)
            sweep_dir = _read_marker(marker)
            if sweep_dir is not None:
                write_stop_file(sweep_dir / STOP_FILE, signum)
            elif child.proc.poll() is None:
                child.proc.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
        try:
            rc = child.wait()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            if watch is not None:
                watch.stop()
        sweep_dir = _read_marker(marker)
    return rc, sweep_dir, list(child.tail), (received[0] if received else None)


def _read_marker(marker: Path) -> Path | None:
    """The sweep directory the multirun reported (``callback.AggregateCallback.on_multirun_start``), or None."""
    text = marker.read_text().strip() if marker.is_file() else ""
    return Path(text) if text else None


def _progress_off(args: Sequence[str]) -> bool:
    return any(a.lstrip("+").lower() in ("progress=false", "progress=0", "progress=no") for a in args)


def _jobs_started(sweep_dir: Path) -> bool:
    """Whether any job of the sweep began its run (Hydra writes a job's .hydra/ before running it)."""
    return any(p.is_dir() for p in sweep_dir.rglob(".hydra"))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    provenance.remember_command(["prorl-bench-sweep", *args])  # what each job's provenance names as its command
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    if any(a.split("=")[0] in INFO_FLAGS for a in args):  # Hydra prints; there is nothing to sweep
        return subprocess.call([sys.executable, "-m", "prorl_bench.cli.app", *args])
    from prorl_bench.cli import preflight  # TRL / verl names and typos, SLURM without SLURM: before Hydra

    prog = "prorl-bench-sweep"
    args = preflight.rename_moved(args, prog)  # task.code.timeout_s=3 -> task.timeout_s=3, with a note
    problem = (
        preflight.names_problem(args, prog) or preflight.ray_problem(args, prog) or preflight.slurm_problem(args, prog)
    )
    if problem:
        print(problem, file=sys.stderr)
        return 2
    cwd = None
    if "--resume" in args:
        try:
            args, cwd = resume_args(args)
        except (SweepDirError, ValueError) as e:
            print(f"prorl-bench-sweep: --resume: {e}", file=sys.stderr)
            return 2
    dry_run, check = "--dry-run" in args, "--no-validate" not in args
    args = [a for a in args if a not in ("--dry-run", "--no-validate")]
    if not check:
        return _launch(args, cwd)
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
    return _launch(args, cwd, len(jobs))


def resume_args(args: Sequence[str]) -> tuple[list[str], Path | None]:
    """``--resume DIR [hydra.*=...] [--dry-run|--no-validate]`` -> the recorded overrides of the
    sweep in DIR (``sweepdir.recorded_command``) plus the extra launcher settings and flags, and the
    directory the sweep was launched from. Anything else is refused: the jobs' configs must not
    change, or their checkpoints would not resume."""
    i = list(args).index("--resume")
    if i + 1 >= len(args) or args[i + 1].startswith("-"):
        raise ValueError("give the sweep directory: prorl-bench-sweep --resume outputs/sweeps/<name>/<date>")
    rest = [*args[:i], *args[i + 2 :]]
    flags = [a for a in rest if a in ("--dry-run", "--no-validate")]
    extra = [a for a in rest if a not in flags]
    bad = [a for a in extra if not a.lstrip("+~").startswith(("hydra.launcher.", "hydra/launcher="))]
    if bad:
        raise ValueError(
            f"{' '.join(bad)}: a resumed sweep runs its recorded jobs unchanged; only launcher settings "
            "(hydra.launcher.*=..., hydra/launcher=...) may be added"
        )
    recorded, cwd = recorded_command(args[i + 1])
    replaced = {a.lstrip("+~").split("=")[0] for a in extra}  # a launcher setting given again replaces its record
    recorded = [a for a in recorded if a.lstrip("+~").split("=")[0] not in replaced]
    if cwd is not None and not cwd.is_dir():
        print(f"prorl-bench-sweep: --resume: the sweep's launch directory {cwd} is gone; relative paths in "
              "its overrides now resolve against the current directory", file=sys.stderr)  # fmt: skip
        cwd = None
    return [*recorded, *extra, *flags], cwd


def resume_command(sweep_dir: Path) -> str:
    """The shell command that finishes ``sweep_dir`` in place."""
    return f"prorl-bench-sweep --resume {shlex.quote(str(sweep_dir))}"


def _launch(args: list[str], cwd: Path | None = None, n_jobs: int | None = None) -> int:
    rc, sweep_dir, tail, stopped = run_sweep(args, cwd, n_jobs)
    if stopped is not None:
        rc = 128 + stopped
    if rc == 0:  # the callback already printed the table and wrote the figures and the report
        _print_report(sweep_dir)
        return 0
    if sweep_dir is None or not _jobs_started(sweep_dir):
        where = "before starting" if sweep_dir is None else f"before any job ran (sweep dir {sweep_dir})"
        print(f"prorl-bench-sweep: the multirun failed {where}, exit {rc}; its error:", file=sys.stderr)
        print("\n".join("    " + line for line in tail[-12:]) or "    (no output)", file=sys.stderr)
        return rc
    from prorl_bench.sweeps.aggregate import aggregate, print_result  # scipy: only for a table printed here

    why = f"stopped by {signal.Signals(stopped).name}" if stopped is not None else "some jobs failed"
    print(f"prorl-bench-sweep: {why} (exit {rc}); aggregating {sweep_dir}", file=sys.stderr)
    try:
        print_result(aggregate(sweep_dir, figures=recorded_figures(sweep_dir)))  # as the multirun was told
    except SweepDirError as e:
        print(f"prorl-bench-sweep: {e}", file=sys.stderr)
    _print_report(sweep_dir)
    left = scan(sweep_dir, n_jobs, ended=True)  # the multirun has exited: none of its jobs runs
    if stopped is not None or left.preempted or left.running or left.waiting:
        unfinished = left.total - left.done - left.failed
        print(f"prorl-bench-sweep: {unfinished} of {left.total} jobs unfinished; to finish them in place "
              f"(completed jobs are skipped, preempted ones resume from their checkpoints):\n"
              f"    {resume_command(sweep_dir)}", file=sys.stderr)  # fmt: skip
    return rc


def _print_report(sweep_dir: Path | None) -> None:
    """The sweep's HTML report (written with its tables), as the last line a finished sweep prints."""
    from prorl_bench.sweeps.aggregate import OUT_SUBDIR
    from prorl_bench.sweeps.report import REPORT

    path = None if sweep_dir is None else sweep_dir / OUT_SUBDIR / REPORT
    if path is not None and path.is_file():
        print(f"prorl-bench-sweep: report: {path}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())

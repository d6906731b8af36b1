"""prorl-bench-sweep as a user drives it: every job validated before the first starts, --dry-run,
Hydra's informational flags, a failing launcher, and SIGTERM to a worker or to the whole process
group of a real joblib sweep (the sweep ends with its table, nothing is orphaned, re-running resumes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FAST

SWEEP = [sys.executable, "-m", "prorl_bench.cli.sweep"]


# Subprocess limits are hang guards only, far above any run time on a loaded 2-core machine: a test
# must not fail because the machine is busy (issue 25); readiness is waited for, never slept for.
HANG_S = 1800


def _run(args: list[str], cwd: Path, timeout: int = HANG_S) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([*SWEEP, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_an_invalid_job_refuses_the_grid_before_anything_runs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = _run(["+sweep=ablation", "+arm=A1,B", "kl_estimator=k1", "seed=0", f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "invalid job [+arm=B" in proc.stderr and "kl_estimator.placement" in proc.stderr
    assert "1 of 2 jobs are invalid; nothing was run" in proc.stderr
    assert not sweep_dir.exists()


@pytest.mark.slow  # ~87 s measured under load (about 10x a quiet machine): composes 36 jobs in subprocesses
def test_dry_run_lists_and_validates_every_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = _run(["+sweep=ablation_small", "--dry-run", f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "#11 +arm=C seed=2 +sweep=ablation_small" in proc.stdout
    assert "12 jobs, all valid (dry run: nothing was run)" in proc.stdout
    assert not sweep_dir.exists()
    bad = _run(["+sweep=ablation_small", "--dry-run", "+arm=A1,B", "seed=0", "algo.lr=0,1e-3"], tmp_path)
    assert bad.returncode == 2 and "2 of 4 jobs are invalid" in bad.stderr and "algo.lr" in bad.stderr


def test_hydra_informational_flags_pass_through(tmp_path):
    proc = _run(["+sweep=ablation_small", "--cfg", "job"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("task:") and "variant:" in proc.stdout and "| group |" not in proc.stdout
    info = _run(["--info", "searchpath"], tmp_path)
    assert info.returncode == 0 and "sweeps" in info.stdout


@pytest.mark.slow  # ~61 s measured under load: a real submitit launch attempt
def test_a_failing_launcher_shows_its_error_not_a_table(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = _run(["+sweep=ablation_small", "hydra/launcher=submitit_slurm", f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.count("srun") == 1 and "hydra/launcher=joblib" in proc.stderr  # no SLURM here: one line
    assert "missing" not in proc.stdout and "| group |" not in proc.stdout


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _group_ends(pgid: int) -> bool:
    """Whether every process of the sweep's group exits. The workers exit right after the sweep, not
    at the same instant (seen: loky's workers a moment after the wrapper); 300 s only bounds a leak check."""
    deadline = time.time() + 300
    while _group_alive(pgid) and time.time() < deadline:
        time.sleep(0.2)
    return not _group_alive(pgid)


def _rows(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


STARTED: list[int] = []


@pytest.fixture(autouse=True)
def _no_leftovers():
    """Whatever a failing test leaves running is killed (SIGKILL to its process group)."""
    yield
    while STARTED:
        pgid = STARTED.pop()
        if _group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        [*SWEEP, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, as a batch system would see it
    )  # fmt: skip
    STARTED.append(proc.pid)
    return proc


def _wait_for_steps(sweep_dir: Path, n: int, proc: subprocess.Popen) -> list[Path]:
    """Wait until a job of the sweep logged ``n`` steps (its readiness marker); fail if the sweep ends first."""
    while True:
        running = [d for d in sweep_dir.glob("*") if d.is_dir() and _rows(d) >= n]
        if running:
            return running
        assert proc.poll() is None, f"the sweep ended before a job logged {n} steps: {proc.communicate()}"
        time.sleep(0.2)


def _summaries(sweep_dir: Path) -> dict[str, dict]:
    paths = [d / "summary.json" for d in sweep_dir.glob("*")]
    return {p.parent.name: json.loads(p.read_text()) for p in paths if p.is_file()}


@pytest.fixture
def sweep_args(tmp_path, base_cache):
    def args(sweep_dir: Path) -> list[str]:
        return [
            "+sweep=ablation", "+arm=A1,B", "seed=0,1", f"hydra.sweep.dir={sweep_dir}", "hydra.launcher.n_jobs=2",
            f"warmup.cache_dir={base_cache}", *FAST, "steps=16", "eval_every=8", "checkpoint.every=2",
            "hydra.callbacks.aggregate.figures=false",  # tables only: these tests read no figure
        ]  # fmt: skip

    return args


@pytest.mark.slow
def test_sigterm_to_one_worker_then_to_the_group_preempts_and_resumes(tmp_path, sweep_args):
    """A real 4-job sweep on 2 loky workers. SIGTERM to one worker preempts its job only: the sweep
    goes on (a job that had not started then starts). SIGTERM to the whole process group then ends the
    sweep with its table (exit 128 + 15), nothing of it outlives it, and running jobs end preempted with
    a checkpoint. The same command resumes: every job completes all its steps. (One sweep for both
    signals: each costs a whole sweep on the suite's two cores.)"""
    sweep_dir = tmp_path / "sweep"
    args = sweep_args(sweep_dir)
    proc = _start(args, tmp_path)
    _wait_for_steps(sweep_dir, 2, proc)
    workers = subprocess.run(["pgrep", "-g", str(proc.pid), "-f", "popen_loky_posix"], capture_output=True, text=True)
    pids = [int(p) for p in workers.stdout.split()]
    assert len(pids) == 2, workers
    began = {d.name for d in sweep_dir.glob("*") if d.is_dir()}  # the jobs that had started
    os.kill(pids[0], signal.SIGTERM)

    def later_job_running() -> list[Path]:  # readiness marker: the worker's job preempted, a new job at step 2
        cut = [n for n, s in _summaries(sweep_dir).items() if s["status"] == "preempted"]
        new = [d for d in sweep_dir.glob("*") if d.is_dir() and d.name not in began and _rows(d) >= 2]
        return new if cut else []

    while not later_job_running():
        assert proc.poll() is None, f"the sweep ended before a later job ran: {proc.communicate()}"
        time.sleep(0.2)
    (cut,) = [n for n, s in _summaries(sweep_dir).items() if s["status"] == "preempted"]
    assert cut in began and _rows(sweep_dir / cut) < 16  # the worker's job (maybe still in its setup: 0 steps)
    os.killpg(proc.pid, signal.SIGTERM)  # the whole group: the wrapper, Hydra, loky's workers
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert _group_ends(proc.pid), "a process of the sweep outlived it"
    assert "stopped by SIGTERM" in err and "### Runs (4 total" in out
    summaries = _summaries(sweep_dir)
    assert {s["status"] for s in summaries.values()} <= {"completed", "preempted"}, summaries
    preempted = [n for n, s in summaries.items() if s["status"] == "preempted"]
    assert cut in preempted and summaries[cut]["steps_completed"] < 16, summaries
    stopped = [n for n in preempted if n != cut and 0 < summaries[n]["steps_completed"] < 16]
    assert stopped, summaries  # the later job, stopped by the group's signal mid-run
    for name in preempted:
        assert summaries[name]["steps_completed"] == _rows(sweep_dir / name)
        if summaries[name]["steps_completed"]:  # a job stopped in its setup has nothing to checkpoint
            assert list((sweep_dir / name / "checkpoints").glob("*.pt"))
    assert (sweep_dir / "aggregate" / "runs.csv").is_file()  # the wrapper's table ...
    assert not list((sweep_dir / "aggregate").glob("*.png"))  # ... without figures, as the command line asked

    again = _run(args, tmp_path)  # the same command resumes
    assert again.returncode == 0, again.stderr[-2000:]
    done = _summaries(sweep_dir)
    assert len(done) == 4 and all(s["status"] == "completed" and s["steps_completed"] == 16 for s in done.values())
    assert "### Runs (4 total, 0 not completed)" in again.stdout
    assert not list((sweep_dir / "aggregate").glob("*.png"))  # the multirun's own table: no figures either


def _files(run_dir: Path) -> dict[str, bytes]:
    """Every file of a job directory but Hydra's own .hydra/ (rewritten by Hydra at each launch)."""
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and ".hydra" not in p.relative_to(run_dir).parts
    }


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_ctrl_c_then_resume_finishes_the_sweep_in_place(tmp_path, base_cache):
    """A real 4-job sweep in its default timestamped directory, jobs run one at a time in the multirun's
    own process (joblib n_jobs=1): Ctrl-C (SIGINT to the process group) once job 1 has completed and
    job 2 logged 2 steps. Then `--resume DIR` from another directory: job 1 is skipped with its files
    byte-identical, job 2 resumes from its checkpoint, jobs 3-4 (never started) run, the table covers
    all four, and no second sweep directory appears."""
    steps = 12
    args = [
        "+sweep=ablation", "+arm=A1,B", "seed=0,1", "hydra.launcher.n_jobs=1", f"warmup.cache_dir={base_cache}",
        *FAST, f"steps={steps}", "eval_every=6", "checkpoint.every=2", "hydra.callbacks.aggregate.figures=false",
    ]  # fmt: skip
    proc = _start(args, tmp_path)
    root = tmp_path / "outputs" / "sweeps" / "ablation" / "explore"  # a study grid: <study>/<block>/<date>

    def ready() -> bool:  # readiness markers: job 1's summary, and job 2's second metrics row
        jobs = sorted(root.glob("*/+arm=A1,*"), key=lambda d: "seed=1" in d.name)
        return len(jobs) == 2 and (jobs[0] / "summary.json").is_file() and _rows(jobs[1]) >= 2

    while not ready():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground process group
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    (sweep_dir,) = root.iterdir()
    assert f"\n    prorl-bench-sweep --resume {sweep_dir}\n" in err  # the exact command, on a line of its own
    # progress lines as jobs start and end; the last one (printed when the sweep ends) has the final counts
    assert "[prorl-bench-sweep] 0/4 done, " in err
    # the last line's other counts race with the jobs' final writes (seen once in a fresh-clone CI run:
    # not "3 preempted"); the statuses themselves are read from the summaries below
    assert "[prorl-bench-sweep] 1/4 done" in err
    before = {d.name: (json.loads((d / "summary.json").read_text()), _files(d)) for d in sweep_dir.glob("+arm=*")}
    status = sorted((s["status"], s["steps_completed"]) for s, _ in before.values())
    assert status[-1] == ("preempted", status[-1][1]) and 2 <= status[-1][1] < steps
    assert status[:3] == [("completed", steps), ("preempted", 0), ("preempted", 0)], status
    (done,) = [n for n, (s, _) in before.items() if s["status"] == "completed"]
    (cut,) = [n for n, (s, _) in before.items() if s["status"] == "preempted" and s["steps_completed"]]
    k = before[cut][0]["steps_completed"]
    assert (sweep_dir / cut / "checkpoints" / f"step_{k:08d}.pt").is_file()

    elsewhere = tmp_path / "elsewhere"  # relative paths resolve against the sweep's launch directory
    elsewhere.mkdir()
    again = _run(["--resume", str(sweep_dir)], elsewhere)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [p.name for p in root.iterdir()] == [sweep_dir.name]  # in place: no new sweep directory
    assert _files(sweep_dir / done) == before[done][1]  # skipped: not one byte changed
    assert "already completed, skipped" in again.stdout
    after = {d.name: json.loads((d / "summary.json").read_text()) for d in sweep_dir.glob("+arm=*")}
    assert all(s["status"] == "completed" and s["steps_completed"] == steps for s in after.values()), after
    resumed = [e for e in _events(sweep_dir / cut) if e["event"] == "resume"]
    assert [e["reason"] for e in resumed] == [f"from checkpoint at step {k}"]  # resumed, not restarted
    assert "### Runs (4 total, 0 not completed)" in again.stdout
    assert "[prorl-bench-sweep] 4/4 done" in again.stderr


def test_resume_refuses_what_it_cannot_do(tmp_path, capsys):
    """--resume needs a multirun directory, and adds only launcher settings to the recorded jobs."""
    from prorl_bench.cli.sweep import main

    assert main(["--resume", str(tmp_path)]) == 2
    assert "multirun.yaml not found" in capsys.readouterr().err
    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  runtime: {cwd: /nonexistent}\n  overrides:\n    hydra: [hydra.mode=MULTIRUN]\n    task: [seed=0]\n"
    )
    assert main(["--resume", str(tmp_path), "algo.lr=1e-3"]) == 2
    err = capsys.readouterr().err
    assert "only launcher settings" in err and "algo.lr=1e-3" in err
    assert main(["--resume"]) == 2
    assert "give the sweep directory" in capsys.readouterr().err


def test_resume_replays_the_recorded_command(tmp_path):
    """The recorded task and Hydra overrides come back (not hydra.mode / an old sweep dir), the sweep
    dir is pinned (quoted for Hydra when the path needs it), and a launcher setting given again
    replaces its recorded value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from prorl_bench.cli.sweep import resume_args

    sweep_dir = tmp_path / "a dir, with=odd 'chars'"
    sweep_dir.mkdir()
    (sweep_dir / "multirun.yaml").write_text(
        f"hydra:\n  runtime: {{cwd: {tmp_path}}}\n  overrides:\n"
        "    hydra: [hydra.launcher.n_jobs=1, hydra.mode=MULTIRUN, hydra.sweep.dir=old]\n"
        "    task: [+sweep=ablation, '+arm=A1,B', seed=0]\n"
    )
    args, cwd = resume_args(["--resume", str(sweep_dir), "hydra.launcher.n_jobs=4", "--dry-run"])
    assert cwd == tmp_path
    assert args[:3] == ["+sweep=ablation", "+arm=A1,B", "seed=0"]
    assert args[4:] == ["hydra.launcher.n_jobs=4", "--dry-run"]
    (pinned,) = OverridesParser.create().parse_overrides([args[3]])
    assert pinned.key_or_group == "hydra.sweep.dir" and pinned.value() == str(sweep_dir)


def test_validation_shares_a_composition_across_seeds_and_keeps_each_jobs_verdict(monkeypatch):
    """validate_jobs composes once per job up to its seed; its verdicts equal composing every job."""
    import hydra
    from hydra import compose, initialize_config_dir

    from prorl_bench.cli import sweep
    from prorl_bench.config import to_config
    from prorl_bench.searchpath import CONF_DIR

    # seeds 14-16 against a block of 0-15 (16 is refused), a bad lr (every seed refused), a seed that is no integer
    jobs = sweep.plan_jobs(["+sweep=routing_oversight", "+arm=route_dual,route_filter", "seed=14,15,16",
                            "algo.lr=0,1e-3"])  # fmt: skip
    jobs.append(["+arm=route_dual", "seed=x", "+sweep=routing_oversight"])

    def each(job):
        try:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                to_config(compose(config_name="config", overrides=list(job)))
            return None
        except Exception as e:
            return f"{type(e).__name__}: {e}".splitlines()[0]

    expected = [(list(j), err) for j in jobs if (err := each(j)) is not None]
    assert len(expected) == 2 * 3 + 2 + 1  # lr=0: every seed of both arms; lr=1e-3: seed 16; seed=x
    assert sum("seed=16 is not in study block" in err for _, err in expected) == 2

    calls = []
    monkeypatch.setattr(hydra, "compose", lambda *a, **k: calls.append(1) or compose(*a, **k))
    assert sweep.validate_jobs(jobs) == expected
    assert len(calls) == 2 * 2 + 1  # one composition per (arm, lr), and one for the job with seed=x


def test_the_table_of_a_stopped_sweep_draws_figures_as_the_multirun_was_told(tmp_path):
    """prorl-bench-sweep tables a stopped or failed sweep itself; whether it draws figures is read
    from the multirun's own record of hydra.callbacks.aggregate.figures (as Hydra parsed it)."""
    from prorl_bench.sweeps.sweepdir import recorded_figures

    def record(callbacks: str) -> bool:
        (tmp_path / "multirun.yaml").write_text(f"hydra:\n  callbacks: {callbacks}\n")
        return recorded_figures(tmp_path)

    assert record("{aggregate: {_target_: x.AggregateCallback, figures: false}}") is False
    assert record("{aggregate: {_target_: x.AggregateCallback, figures: true}}") is True
    assert record("{aggregate: {_target_: x.AggregateCallback}}") is True  # the callback's default
    assert record("{}") is True  # no callback recorded (hydra.callbacks={}): the aggregator's default

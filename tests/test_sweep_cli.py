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

from .conftest import FAST

SWEEP = [sys.executable, "-m", "prorl_bench.sweep"]


def _run(args: list[str], cwd: Path, timeout: int = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([*SWEEP, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_an_invalid_job_refuses_the_grid_before_anything_runs(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = _run(["+sweep=ablation", "+arm=A1,B", "kl_estimator=k1", "seed=0", f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "invalid job [+arm=B" in proc.stderr and "kl_estimator.placement" in proc.stderr
    assert "1 of 2 jobs are invalid; nothing was run" in proc.stderr
    assert not sweep_dir.exists()


def test_dry_run_lists_and_validates_every_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = _run(["+sweep=ablation_small", "--dry-run", f"hydra.sweep.dir={sweep_dir}"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "#11 +arm=C seed=2 +sweep=ablation_small" in proc.stdout
    assert "12 jobs, all valid (dry run: nothing was run)" in proc.stdout
    assert not sweep_dir.exists()
    bad = _run(["+sweep=ablation_small", "--dry-run", "algo.lr=0,1e-3"], tmp_path)
    assert bad.returncode == 2 and "12 of 24 jobs are invalid" in bad.stderr and "algo.lr" in bad.stderr


def test_hydra_informational_flags_pass_through(tmp_path):
    proc = _run(["+sweep=ablation_small", "--cfg", "job"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("task:") and "variant:" in proc.stdout and "| group |" not in proc.stdout
    info = _run(["--info", "searchpath"], tmp_path)
    assert info.returncode == 0 and "sweeps" in info.stdout


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


def _wait_for_steps(sweep_dir: Path, n: int, timeout: float = 120) -> list[Path]:
    t0 = time.time()
    while time.time() - t0 < timeout:
        running = [d for d in sweep_dir.glob("*") if d.is_dir() and _rows(d) >= n]
        if running:
            return running
        time.sleep(0.2)
    raise AssertionError(f"no job of {sweep_dir} logged {n} steps in {timeout} s")


def _summaries(sweep_dir: Path) -> dict[str, dict]:
    paths = [d / "summary.json" for d in sweep_dir.glob("*")]
    return {p.parent.name: json.loads(p.read_text()) for p in paths if p.is_file()}


@pytest.fixture
def sweep_args(tmp_path, base_cache):
    def args(sweep_dir: Path) -> list[str]:
        return [
            "+sweep=ablation", "+arm=A1,B", "seed=0,1", f"hydra.sweep.dir={sweep_dir}", "hydra.launcher.n_jobs=2",
            f"warmup.cache_dir={base_cache}", *FAST, "steps=40", "eval_every=20", "checkpoint.every=2",
        ]  # fmt: skip

    return args


@pytest.mark.slow
def test_sigterm_to_the_process_group_ends_the_sweep_with_its_table(tmp_path, sweep_args):
    sweep_dir = tmp_path / "sweep"
    proc = _start(sweep_args(sweep_dir), tmp_path)
    _wait_for_steps(sweep_dir, 2)
    os.killpg(proc.pid, signal.SIGTERM)  # the whole group: the wrapper, Hydra, loky's workers
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    deadline = time.time() + 15
    while _group_alive(proc.pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not _group_alive(proc.pid), "a process of the sweep outlived it"
    assert "stopped by SIGTERM" in err and "### Runs (4 total" in out
    summaries = _summaries(sweep_dir)
    assert summaries and all(s["status"] == "preempted" for s in summaries.values())
    started = [d for d in sweep_dir.glob("*") if _rows(d) > 0]
    assert started and all(list((d / "checkpoints").glob("*.pt")) for d in started)
    assert all(summaries[d.name]["steps_completed"] == _rows(d) < 40 for d in started)

    again = _run(sweep_args(sweep_dir), tmp_path, timeout=300)  # the same command resumes
    assert again.returncode == 0, again.stderr[-2000:]
    done = _summaries(sweep_dir)
    assert len(done) == 4 and all(s["status"] == "completed" and s["steps_completed"] == 40 for s in done.values())


@pytest.mark.slow
def test_sigterm_to_one_worker_preempts_its_job_only(tmp_path, sweep_args):
    sweep_dir = tmp_path / "sweep"
    proc = _start(sweep_args(sweep_dir), tmp_path)
    _wait_for_steps(sweep_dir, 2)
    workers = subprocess.run(["pgrep", "-g", str(proc.pid), "-f", "popen_loky_posix"], capture_output=True, text=True)
    pids = [int(p) for p in workers.stdout.split()]
    assert len(pids) == 2, workers
    os.kill(pids[0], signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0  # a preempted job is a failed job for Hydra
    statuses = sorted(s["status"] for s in _summaries(sweep_dir).values())
    assert statuses == ["completed"] * 3 + ["preempted"], statuses
    assert "### Runs (4 total, 1 not completed)" in out
    assert not _group_alive(proc.pid)
    again = _run(sweep_args(sweep_dir), tmp_path, timeout=300)
    assert again.returncode == 0 and all(s["status"] == "completed" for s in _summaries(sweep_dir).values())

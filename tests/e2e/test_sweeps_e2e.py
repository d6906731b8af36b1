"""Real multiruns through Hydra: joblib in parallel with a failing job, submitit_local, per-job
isolation in a reused process, and the analysis notebook executed headless on a real sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from prorl_bench.searchpath import ROOT
from tests.conftest import FAST as TINY

CURVE_KEYS = ("reward/mean", "loss/total", "loss/pg", "kl/old", "grad_norm")


@pytest.fixture(scope="session")
def sweep_cache(tmp_path_factory) -> Path:
    """One warm-up base cache shared by every sweep of the session."""
    return tmp_path_factory.mktemp("sweep_base_cache")


HANG_S = 1800  # a hang guard only, far above any run time on a loaded 2-core machine (issue 25)


def _run(args: list[str], cwd: Path, timeout: int = HANG_S) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _curves(run_dir: Path) -> dict[str, list]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {k: [r[k] for r in rows] for k in CURVE_KEYS}


@pytest.fixture(scope="session")
def failing_sweep(tmp_path_factory, sweep_cache):
    """prorl-bench-sweep on 3 jobs in parallel (2 joblib workers); variant=B rejects k1's reward placement."""
    tmp = tmp_path_factory.mktemp("failing_sweep")
    sweep_dir = tmp / "sweep"
    args = [
        "-m",
        "prorl_bench.cli.sweep",
        "--no-validate",  # B with k1 in the reward is invalid: here it must fail as a job, at run time
        "+sweep=ablation",
        "+arm=A1,A2,B",
        "kl_estimator=k1",
        "seed=0",
        f"hydra.sweep.dir={sweep_dir}",
        "hydra.launcher.n_jobs=2",
        f"warmup.cache_dir={sweep_cache}",
        *TINY,
    ]
    return _run(args, cwd=tmp), sweep_dir


@pytest.mark.slow
def test_failed_job_still_aggregates(failing_sweep):
    proc, sweep_dir = failing_sweep
    assert proc.returncode != 0, "a failed job must make the sweep exit non-zero"
    out = proc.stdout
    assert "| A1 | 1/1 ok |" in out and "| A2 | 1/1 ok |" in out
    assert "| B | 0/1 ok, 1 failed |" in out
    assert "ConfigError: invalid config value kl_estimator.placement='reward'" in out
    *_, figure, report_line, last = out.rstrip().splitlines()
    assert "[prorl-bench-aggregate] figure:" in figure, "the table, figures and report end the output"
    report = sweep_dir.resolve() / "aggregate" / "report.html"
    assert report_line == f"[prorl-bench-aggregate] report: {report}" and report.is_file()
    assert last == f"prorl-bench-sweep: report: {report}"  # a sweep ends by printing its report's path
    runs = pd.read_csv(sweep_dir / "aggregate" / "runs.csv").set_index("group")
    assert runs.loc["B", "status"] == "failed" and "variant B" in runs.loc["B", "error"]
    assert runs.loc["A1", "status"] == "completed" and runs.loc["A1", "steps_logged"] == 6
    for name in ("curves.png", "stage_time.png", "reference_cost.png"):
        assert (sweep_dir / "aggregate" / name).stat().st_size > 10_000
    # run directories sit directly in the sweep dir, named by their knobs (not the grid name, not paths)
    a1 = Path(runs.loc["A1", "run_dir"])
    assert a1.parent == sweep_dir
    assert a1.name == ",".join(sorted(["+arm=A1", "kl_estimator=k1", "seed=0", *TINY]))


@pytest.mark.slow
def test_parallel_jobs_keep_the_a1_a2_invariant(failing_sweep):
    _, sweep_dir = failing_sweep
    runs = pd.read_csv(sweep_dir / "aggregate" / "runs.csv").set_index("group")
    a1, a2 = (Path(runs.loc[v, "run_dir"]) for v in ("A1", "A2"))
    assert _curves(a1) == _curves(a2)


@pytest.mark.slow
def test_jobs_are_isolated_in_a_reused_process(tmp_path, sweep_cache):
    """n_jobs=1: joblib runs seed=1 then seed=0 in one process; seed 0 must equal a fresh single run."""
    common = [f"warmup.cache_dir={sweep_cache}", *TINY]
    multi = _run(
        [
            "-m",
            "prorl_bench.cli.app",
            "-m",
            "+sweep=ablation",
            "+arm=A1",
            "seed=1,0",
            "hydra.launcher.n_jobs=1",
            f"hydra.sweep.dir={tmp_path / 'multi'}",
            "~hydra.callbacks.aggregate",
            *common,
        ],
        cwd=tmp_path,
    )
    assert multi.returncode == 0, multi.stderr[-3000:]
    single = _run(
        [
            "-m",
            "prorl_bench.cli.app",
            "seed=0",
            "hardware.torch_threads=1",
            "progress=false",
            f"hydra.run.dir={tmp_path / 'single'}",
            *common,
        ],
        cwd=tmp_path,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    (second,) = [p for p in (tmp_path / "multi").iterdir() if "seed=0" in p.name]
    assert _curves(second) == _curves(tmp_path / "single")


@pytest.mark.slow
def test_submitit_local_runs_a_grid_end_to_end(tmp_path, sweep_cache):
    sweep_dir = tmp_path / "sweep"
    proc = _run(
        [
            "-m",
            "prorl_bench.cli.app",
            "-m",
            "hydra/launcher=submitit_local",
            "variant=A1,B",
            "seed=0",
            "hydra.launcher.timeout_min=10",
            "hydra.callbacks.aggregate.figures=false",  # the table is checked, not the figures
            f"hydra.sweep.dir={sweep_dir}",
            f"warmup.cache_dir={sweep_cache}",
            *TINY,
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| A1 | 1/1 ok |" in proc.stdout and "| B | 1/1 ok |" in proc.stdout  # on_multirun_end ran
    assert (sweep_dir / ".submitit").is_dir()  # the submitit path, not joblib
    runs = pd.read_csv(sweep_dir / "aggregate" / "runs.csv")
    assert list(runs["status"]) == ["completed", "completed"]
    assert (runs["steps_logged"] == 6).all()


@pytest.mark.slow
def test_analysis_notebook_executes_headless(failing_sweep):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    _, sweep_dir = failing_sweep
    nb = nbformat.read(ROOT / "notebooks" / "analysis.ipynb", as_version=4)
    os.environ["PRORL_SWEEP_DIR"] = str(sweep_dir)
    try:
        nbclient.NotebookClient(
            nb, timeout=HANG_S, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
        ).execute()
    finally:
        del os.environ["PRORL_SWEEP_DIR"]
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    texts = "".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/markdown", "")) for o in outputs)
    assert "| B | 0/1 ok, 1 failed |" in texts
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 3


@pytest.mark.slow
def test_a_study_grid_runs_end_to_end_at_reduced_size(tmp_path, sweep_cache):
    """+sweep=adam_step_hazard, 2 seeds x 4 arms x 6 steps: every job completes, the table is paired
    against the study's own baseline and states n."""
    sweep_dir = tmp_path / "sweep"
    args = ["-m", "prorl_bench.cli.sweep", "+sweep=adam_step_hazard", "seed=0,1"]
    # one joblib job at a time, in the multirun process: no loky workers to start (4 s of CPU each)
    args += [f"hydra.sweep.dir={sweep_dir}", "hydra.launcher.n_jobs=1", f"warmup.cache_dir={sweep_cache}", *TINY]
    args += ["reset.every=2", "eval.n_samples=4", "eval.ks=[1,4]"]
    proc = _run(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "### Paired differences vs baseline `factor=1.0, step=keep`" in proc.stdout
    comparisons = pd.read_csv(sweep_dir / "aggregate" / "comparisons.csv")
    assert set(comparisons["group"]) == {"factor=0.0, step=keep", "factor=0.0, step=reset", "factor=1.0, step=reset"}
    assert (comparisons["n"] == 2).all()
    assert comparisons["paired"].all()
    assert (sweep_dir / "aggregate" / "passk.png").stat().st_size > 10_000


@pytest.mark.slow
def test_the_routing_study_runs_end_to_end_at_reduced_size(tmp_path, sweep_cache):
    """+sweep=routing, 2 seeds x 2 arms x 6 steps: the table has the routing columns and pairs the
    routed arm with the plain LoRA of equal rank; the routing figure is drawn."""
    sweep_dir = tmp_path / "sweep"
    args = ["-m", "prorl_bench.cli.sweep", "+sweep=routing", "seed=0,1"]
    # one joblib job at a time, in the multirun process: no loky workers to start (4 s of CPU each)
    args += [f"hydra.sweep.dir={sweep_dir}", "hydra.launcher.n_jobs=1", f"warmup.cache_dir={sweep_cache}", *TINY]
    args += ["eval.n_samples=4", "eval.ks=[1,4]"]
    proc = _run(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "### Paired differences vs baseline `lora_equal`" in proc.stdout
    assert "hack (forget ablated)" in proc.stdout and "success (both)" in proc.stdout
    comparisons = pd.read_csv(sweep_dir / "aggregate" / "comparisons.csv")
    routed = comparisons[comparisons["metric"] == "route_both_hack"]
    assert list(routed["group"]) == ["routed"] and routed["paired"].all() and (routed["n"] == 2).all()
    runs = pd.read_csv(sweep_dir / "aggregate" / "runs.csv").set_index("group")
    plain = runs.loc["lora_equal"]  # no forget adapter: the policy is its own ablation
    assert (plain["route_retain_hack"] == plain["route_both_hack"]).all()
    assert runs.loc["routed", "route_retain_hack"].notna().all()
    ablated = comparisons[comparisons["metric"] == "route_retain_hack"]
    assert list(ablated["group"]) == ["routed"] and ablated["paired"].all()
    assert (sweep_dir / "aggregate" / "routing.png").stat().st_size > 10_000

"""``hydra/launcher=population``: grouping, the dry run, and a killed population that resumes.

Every command is the installed ``prorl-bench`` entry point started from a temporary directory with no
``PYTHONPATH``: Hydra finds the launcher only if the install put it on the ``hydra_plugins`` namespace's
path (DESIGN.md §12), so a packaging defect fails these tests."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hydra_plugins.prorl_bench_population.population_launcher import _pour, per_worker
from prorl_bench.run.trainer import train
from tests.conftest import FAST as _FAST
from tests.conftest import make_config, strip_timing

# populations batch learned positions only (population_blockers): these tests run the v1 regime (learned
# positions, lr 1e-3, where a KL spike resets members at different steps)
FAST = [*_FAST, "regime=v1_trap"]

EXE = str(Path(sys.executable).with_name("prorl-bench"))  # the console script the install made


def _cmd(sweep_dir: Path, cache: Path, *overrides: str) -> list[str]:
    return [
        EXE, "-m", *FAST, *overrides, f"warmup.cache_dir={cache}",
        "hydra/launcher=population", f"hydra.sweep.dir={sweep_dir}", "hydra.callbacks={}",
    ]  # fmt: skip


def _env() -> dict[str, str]:
    """The user's environment: nothing on PYTHONPATH points at the checkout."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "OMP_NUM_THREADS": "1"}


def test_dry_run_says_which_jobs_batch_and_why_others_cannot(tmp_path):
    out = subprocess.run(
        _cmd(
            tmp_path / "sw",
            tmp_path / "cache",
            "seed=0,1,2",
            "adapter=none,lora",
            "hydra.launcher.dry_run=true",
            "hydra.launcher.size=2",
        ),  # fmt: skip
        env=_env(),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    pops = [ln for ln in lines if ln.startswith("population of")]
    solo = [ln for ln in lines if ln.startswith("single job")]
    # three adapter=none seeds with size 2: populations of 2 and 1 member(s); lora jobs run alone, with the key named
    assert len(pops) == 1 and all("adapter=none" in ln for ln in pops) and pops[0].count("#") == 2
    assert sum("adapter=lora: adapters are not batched" in ln for ln in solo) == 3
    assert any("alone in its group" in ln and "adapter=none" in ln for ln in solo)
    assert lines[-1] == "1 populations, 4 single jobs"
    assert not (tmp_path / "sw").exists() or not any((tmp_path / "sw").rglob("metrics.jsonl"))


def test_plan_gives_no_worker_more_jobs_than_joblib_and_keeps_populations_within_a_group():
    """Brute force over random grids: every job planned once; no worker holds more than joblib's share,
    ceil(jobs / workers) (so a population never runs on fewer cores than the same jobs under joblib,
    the cause of issue 37's 0.63x); a population is 2..size jobs of one group, in one worker; a group's
    part in one worker is one population unless the size cuts it."""
    rng = random.Random(0)
    for _ in range(400):
        groups = [rng.randint(1, 12) for _ in range(rng.randint(0, 4))]
        n_solo, size, workers = rng.randint(0, 3), rng.randint(1, 6), rng.randint(1, 5)
        pieces, idx = [], 0
        for g, n in enumerate(groups):
            pieces.append(([(idx + k, [f"arm={g}", f"seed={k}"], g) for k in range(n)], None if n > 1 else "alone"))
            idx += n
        for _k in range(n_solo):
            pieces.append(([(idx, ["adapter=lora"], None)], "adapter=lora"))
            idx += 1
        if idx == 0:
            continue
        units = _pour(pieces, size, per_worker(idx, min(workers, idx)))
        assert sorted(i for u in units for i, _ in u.members) == list(range(idx))
        load: dict[int, int] = {}
        for u in units:
            load[u.worker] = load.get(u.worker, 0) + len(u.members)
            if u.why is None:
                assert 2 <= len(u.members) <= size and len({c for c in u.cfgs}) == 1
            else:
                assert len(u.members) == 1
        assert max(load.values()) <= -(-idx // workers) and len(load) <= workers
        for g in range(len(groups)):  # a group's part in one worker: ceil(part / size) units, sizes within 1
            for w in load:
                parts = [len(u.members) for u in units if u.worker == w and g in u.cfgs]
                if parts:
                    assert len(parts) == -(-sum(parts) // size) and max(parts) - min(parts) <= 1


def test_dry_run_spreads_one_group_over_the_workers(tmp_path):
    """4 seeds, 2 workers: two populations of 2 (one per core), not one of 4 that idles a core; the
    plan's first line says why. One worker: one population of 4."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the plan uses min(hydra.launcher.n_jobs, CPUs) workers: 2 workers need 2 CPUs")
    for n_jobs, expect in ((2, ["population of 2 (worker 0)", "population of 2 (worker 1)"]),
                           (1, ["population of 4 (worker 0)"])):  # fmt: skip
        out = subprocess.run(
            _cmd(tmp_path / "sw", tmp_path / "cache", "seed=0,1,2,3", "hydra.launcher.dry_run=true",
                 f"hydra.launcher.n_jobs={n_jobs}"),  # fmt: skip
            env=_env(), capture_output=True, text=True, cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        lines = [ln for ln in out.stdout.splitlines() if not ln.startswith("[")]  # the printed plan, not the log
        assert [ln.split(":")[0] for ln in lines if ln.startswith("population")] == expect, lines
        assert lines[0].startswith(f"4 jobs on {n_jobs} worker processes (hydra.launcher.n_jobs={n_jobs}")
        assert f"at most {4 // n_jobs} jobs per worker, the share the joblib launcher gives each" in lines[0]


def _metrics(d: Path) -> list[dict]:
    return strip_timing([json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()])


@pytest.mark.slow
def test_population_killed_with_sigkill_resumes_to_the_single_runs(tmp_path, base_cache):
    """SIGKILL the whole multirun once a member has checkpointed; the same command resumes every
    member, and each ends equal (metrics bit for bit) to an uninterrupted single run with its seed."""
    sweep, cache = tmp_path / "sw", base_cache  # the session's bases (file-locked; shared with other tests)
    args = ("seed=0,1", "steps=8", "checkpoint.every=2", "hydra.launcher.n_jobs=1")
    proc = subprocess.Popen(_cmd(sweep, cache, *args), env=_env(), cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        while proc.poll() is None and not list(sweep.rglob("checkpoints/*.pt")):
            try:
                proc.wait(timeout=0.5)  # readiness marker: a member's first checkpoint
            except subprocess.TimeoutExpired:
                pass
        assert proc.poll() is None, "the population finished before it could be killed"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    runs = sorted(p.parent for p in sweep.rglob("metrics.jsonl"))
    assert len(runs) == 2 and not all((r / "summary.json").exists() for r in runs)
    again = subprocess.run(_cmd(sweep, cache, *args), env=_env(), cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    plan = json.loads((sweep / "population_plan.json").read_text())  # the plan is recorded beside the runs
    assert plan["workers"] == 1 and [u["population"] for u in plan["units"]] == [True]
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "completed", summary
        events = [json.loads(x)["event"] for x in (run / "events.jsonl").read_text().splitlines()]
        seed = int(next(p for p in run.name.split(",") if p.startswith("seed=")).split("=")[1])
        single = tmp_path / f"single{seed}"
        job = [a for a in args if not a.startswith(("seed", "hydra."))]  # the job's own keys, not the launcher's
        train(make_config([*FAST, *job, f"seed={seed}"]), single, cache)
        assert _metrics(run) == _metrics(single), run.name
        assert "resume" in events or events.count("start") == 1

"""Reliability: kill/resume identity, preemption, config-mismatch refusal, non-finite guard."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prorl_bench.config import ConfigError
from prorl_bench.run.outputs import read_jsonl
from tests.conftest import FAST, make_config, strip_timing

EXE = str(Path(sys.executable).with_name("prorl-bench"))
RUN = FAST[:-1] + ["steps=20", "eval_every=10", "checkpoint.every=5", "progress=false", "hardware.torch_threads=1"]


def _cmd(run_dir, cache, extra=()):
    return [EXE, *RUN, f"warmup.cache_dir={cache}", f"hydra.run.dir={run_dir}", *extra]


def _start(run_dir, cache, extra=()):
    return subprocess.Popen(_cmd(run_dir, cache, extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_rows(run_dir, n, proc):
    """Wait for the run's n-th metrics row (readiness marker; no deadline: a loaded machine is slow)."""
    path = Path(run_dir) / "metrics.jsonl"
    while True:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read()}")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, base_cache):
    d = tmp_path_factory.mktemp("uninterrupted") / "run"
    r = subprocess.run(_cmd(d, base_cache), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return d


def _same_run(d, ref):
    rows = read_jsonl(d / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 21))  # every step exactly once
    assert strip_timing(rows) == strip_timing(read_jsonl(ref / "metrics.jsonl"))
    assert read_jsonl(d / "validation.jsonl") == read_jsonl(ref / "validation.jsonl")
    drop = ("start", "resume", "preempted", "end")
    ev = [e for e in read_jsonl(d / "events.jsonl") if e["event"] not in drop]
    assert ev == [e for e in read_jsonl(ref / "events.jsonl") if e["event"] not in drop]


@pytest.mark.slow
def test_sigkill_and_resume_is_identical_to_an_uninterrupted_run(tmp_path, base_cache, reference_run):
    d = tmp_path / "run"
    proc = _start(d, base_cache)
    _wait_rows(d, 8, proc)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert 8 <= len(read_jsonl(d / "metrics.jsonl")) < 20  # killed mid-way, past a checkpoint (step 5)
    r = subprocess.run(_cmd(d, base_cache), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    _same_run(d, reference_run)
    assert json.loads((d / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_sigterm_checkpoints_with_status_preempted_and_resume_completes(tmp_path, base_cache, reference_run):
    d = tmp_path / "run"
    proc = _start(d, base_cache)
    _wait_rows(d, 7, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=1800) == 75, proc.stderr.read()  # a hang guard only
    summary = json.loads((d / "summary.json").read_text())
    assert summary["status"] == "preempted"
    last = summary["steps_completed"]
    assert (d / "checkpoints" / f"step_{last:08d}.pt").exists()  # checkpointed at the signal, off-cadence ok
    assert [e for e in read_jsonl(d / "events.jsonl") if e["event"] == "preempted"][0]["reason"] == "SIGTERM"
    r = subprocess.run(_cmd(d, base_cache), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    _same_run(d, reference_run)


def test_checkpoints_keep_last_n_and_resume_refuses_a_different_config(run_exp, base_cache):
    from prorl_bench.run.trainer import train

    summary, d = run_exp(["checkpoint.every=2", "checkpoint.keep_last=2"], name="ck")
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == [
        "step_00000004.pt",
        "step_00000004.pt.sha256",
        "step_00000006.pt",
        "step_00000006.pt.sha256",
    ]
    other = make_config(FAST + ["algo.lr=0.5", "seed=9"])
    with pytest.raises(ConfigError, match=r"2 field\(s\): algo.lr: 0.0001 -> 0.5; seed: 0 -> 9"):
        train(other, d, base_cache)
    longer = make_config(FAST + ["checkpoint.every=2", "steps=8"])  # `steps` may change: extend a run
    assert train(longer, d, base_cache)["steps_completed"] == 8
    assert [r["step"] for r in read_jsonl(d / "metrics.jsonl")] == list(range(1, 9))


def test_resume_with_growth_and_resets_restores_adapter_rank(run_exp, tmp_path, base_cache):
    from prorl_bench.run.trainer import train

    knobs = FAST + [
        "variant=C",
        "reset=periodic",
        "reset.every=2",
        "opt_reset=soft",
        "adapter=lora",
        "growth=rank",
        "growth.grow_every=2",
        "growth.migration=preserve",
        "checkpoint.every=4",
    ]
    full = train(make_config(knobs), tmp_path / "full", base_cache)
    part = tmp_path / "part"
    train(make_config(knobs[:1] + ["steps=4"] + knobs[1:]), part, base_cache)  # "interrupted" after step 4
    (part / "metrics.jsonl").open("a").write('{"step": 5, "torn')  # a torn last line from the crash
    resumed = train(make_config(knobs), part, base_cache)
    assert resumed["reset_steps"] == full["reset_steps"]
    assert strip_timing(read_jsonl(part / "metrics.jsonl")) == strip_timing(
        read_jsonl(tmp_path / "full" / "metrics.jsonl")
    )


def test_skip_batch_guard_counts_and_continues(run_exp, monkeypatch):
    import prorl_bench.run.phases as phases

    real = phases.clipped_surrogate
    calls = {"n": 0}

    def sometimes_nan(*a, **k):
        calls["n"] += 1
        loss, clipped = real(*a, **k)
        return (loss * float("nan") if calls["n"] % 4 == 1 else loss), clipped

    monkeypatch.setattr(phases, "clipped_surrogate", sometimes_nan)
    with pytest.warns(UserWarning, match="skipped"):
        summary, d = run_exp(["guard.nonfinite=skip_batch"], name="skip")
    assert summary["status"] == "completed"
    assert read_jsonl(d / "metrics.jsonl")[-1]["guard/skipped"] == 6  # 6 steps x 4 minibatches / 4


def test_nan_config_values_are_rejected():
    with pytest.raises(ConfigError, match="algo.beta"):
        make_config(["algo.beta=inf"])
    with pytest.raises(ConfigError, match="algo.lr"):
        make_config(["algo.lr=nan"])


def test_injected_nan_fails_the_run_and_the_aggregator_marks_it_failed(tmp_path, base_cache, monkeypatch):
    """A NaN mid-run: the run stops with stage and tensor named, summary.json says failed (as the
    app writes it), and the aggregator lists it as failed beside the completed run."""
    import prorl_bench.run.phases as phases
    import prorl_bench.run.trainer as trainer
    from prorl_bench.run.guards import NonFiniteError
    from prorl_bench.run.outputs import write_summary
    from prorl_bench.run.record import failed_summary
    from prorl_bench.sweeps.grouping import run_table
    from prorl_bench.sweeps.sweepdir import load_sweep

    sweep = tmp_path / "sweep"
    for seed in (0, 1):
        d = sweep / f"seed={seed},variant=A1"
        (d / ".hydra").mkdir(parents=True)
        (d / ".hydra" / "overrides.yaml").write_text(f"- seed={seed}\n- variant=A1\n")
    trainer.train(make_config(FAST + ["seed=0"]), sweep / "seed=0,variant=A1", base_cache)
    real = phases.clipped_surrogate
    calls = {"n": 0}

    def nan_at_step_3(*a, **k):
        calls["n"] += 1
        loss, clipped = real(*a, **k)
        return (loss * float("nan") if calls["n"] > 8 else loss), clipped  # 4 minibatches per step

    monkeypatch.setattr(phases, "clipped_surrogate", nan_at_step_3)
    failed_dir = sweep / "seed=1,variant=A1"
    with pytest.raises(NonFiniteError, match="'loss/total' at step 3, stage 'update'") as info:
        trainer.train(make_config(FAST + ["seed=1"]), failed_dir, base_cache)
    write_summary(failed_dir, failed_summary(info.value))
    runs = run_table(load_sweep(sweep)).set_index("seed")
    assert runs.loc["0", "status"] == "completed"
    assert runs.loc["1", "status"] == "failed" and "loss/total" in runs.loc["1", "error"]
    assert len(read_jsonl(failed_dir / "metrics.jsonl")) == 2  # the steps before the NaN, nothing after


# -- records never lost (issue 24): a restart that stops before a new step changes nothing; a failed
# extension keeps the finished run readable


def _record(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"}


def test_record_snapshot_restores_bytes_and_detects_new_steps(tmp_path):
    from prorl_bench.run.outputs import FINISHED_CONFIG, FINISHED_SUMMARY
    from prorl_bench.run.record import RecordSnapshot

    d = tmp_path
    (d / "summary.json").write_text(json.dumps({"status": "completed", "steps_completed": 2}))
    (d / "config_resolved.yaml").write_text("steps: 2\n")
    (d / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    before = _record(d)
    snap = RecordSnapshot.take(d)
    snap.keep_finished(2)  # the same length: not an extension
    assert not (d / FINISHED_SUMMARY).exists()
    snap.keep_finished(3)
    assert (d / FINISHED_SUMMARY).read_bytes() == before["summary.json"]
    assert (d / FINISHED_CONFIG).read_bytes() == before["config_resolved.yaml"]
    (d / "metrics.jsonl").write_text('{"step": 1}\n')  # a resume cut the logs back ...
    (d / "config_resolved.yaml").write_text("steps: 3\n")  # ... and wrote its config ...
    (d / "validation.jsonl").write_text('{"step": 0}\n')  # ... and a file that was not there
    (d / "summary.json").write_text('{"status": "failed"}')
    assert not snap.new_steps_logged()
    snap.restore()
    assert _record(d) == before  # byte for byte, the new file gone, the copies removed
    (d / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    assert snap.new_steps_logged()


def _cli(d, cache, *extra, inject: str | None = None):
    args = [*FAST, "progress=false", "hardware.torch_threads=1", "checkpoint.every=3", f"warmup.cache_dir={cache}",
            f"hydra.run.dir={d}", *extra]  # fmt: skip
    if inject is None:
        return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=600)
    code = f"{inject}\nimport sys\nfrom prorl_bench.cli.app import main\n"
    code += "sys.argv = ['prorl-bench', *sys.argv[1:]]\nmain()\n"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600)


FAIL_AT_THE_SECOND_NEW_STEP = """
import prorl_bench.run.phases as t
real, calls = t.score_details, []
def score_details(*a, **k):
    calls.append(1)
    if len(calls) == 2:
        raise RuntimeError("injected failure in the second new step")
    return real(*a, **k)
t.score_details = score_details
"""


@pytest.mark.slow
def test_a_finished_run_keeps_its_record_through_refused_and_failed_restarts(tmp_path, base_cache):
    from prorl_bench.run.outputs import FINISHED_CONFIG, FINISHED_SUMMARY
    from prorl_bench.sweeps.sweepdir import load_run

    d = tmp_path / "run"
    r = _cli(d, base_cache)
    assert r.returncode == 0, r.stderr
    before = _record(d)
    assert json.loads(before["summary.json"])["status"] == "completed"
    ckpts = {p: p.read_bytes() for p in (d / "checkpoints").glob("step_*.pt")}
    for p, data in ckpts.items():  # every checkpoint damaged: CorruptFileError on any resume
        p.write_bytes(data[:-100] + bytes(100))
    for extra in ([], ["steps=9"]):  # the same command, and an extension: both stop before a new step
        r = _cli(d, base_cache, *extra)
        assert r.returncode != 0 and "CorruptFileError" in r.stderr, r.stderr
        assert _record(d) == before, extra  # summary, config, metrics, logs: byte for byte
    for p, data in ckpts.items():
        p.write_bytes(data)
    # an extension that fails after one new step: summary.json says failed, the finished run stays readable
    r = _cli(d, base_cache, "steps=9", inject=FAIL_AT_THE_SECOND_NEW_STEP)
    assert r.returncode != 0 and "injected failure" in r.stderr, r.stderr
    assert json.loads((d / "summary.json").read_text())["status"] == "failed"
    assert [row["step"] for row in read_jsonl(d / "metrics.jsonl")] == list(range(1, 8))
    assert (d / FINISHED_SUMMARY).read_bytes() == before["summary.json"]
    assert (d / FINISHED_CONFIG).read_bytes() == before["config_resolved.yaml"]
    run = load_run(d)
    assert run.status == "completed" and run.summary["steps_completed"] == 6 and "extension failed" in run.error
    assert list(run.metrics["step"]) == list(range(1, 7)) and run.config["steps"] == 6
    # the extension, re-run, completes: its record supersedes the kept copies
    r = _cli(d, base_cache, "steps=9")
    assert r.returncode == 0, r.stderr
    assert not (d / FINISHED_SUMMARY).exists() and not (d / FINISHED_CONFIG).exists()
    assert load_run(d).status == "completed" and load_run(d).summary["steps_completed"] == 9


# Audit item 9: resuming on another thread count silently changed the floats
def test_resume_with_another_thread_count_is_refused(run_exp, base_cache):
    from prorl_bench.run.trainer import train

    _, d = run_exp(["hardware.torch_threads=1"], name="t")
    with pytest.raises(ConfigError, match="hardware.torch_threads: 1 -> 2"):
        train(make_config(FAST + ["hardware.torch_threads=2", "steps=8"]), d, base_cache)


# Audit item 5: deleted metrics rows stayed deleted under a "completed" summary
def test_resume_repairs_lost_rows_and_the_aggregator_flags_short_logs(run_exp, tmp_path):
    from prorl_bench.sweeps.sweepdir import load_run

    knobs = ["checkpoint.every=3"]
    _, full = run_exp(knobs, name="full")
    rows = (full / "metrics.jsonl").read_text().splitlines()
    (full / "metrics.jsonl").write_text("\n".join(rows[:2] + rows[4:]) + "\n")  # rows of steps 3, 4 lost
    (full / ".hydra").mkdir()
    (full / ".hydra" / "overrides.yaml").write_text("[]\n")
    run = load_run(full)
    assert run.status == "incomplete" and "4 rows but summary.json says 6" in run.error
    part = full.parent / "part"
    import shutil

    shutil.copytree(full, part)
    for p in (part / "checkpoints").glob("step_00000006*"):
        p.unlink()
    (part / "summary.json").unlink()
    run_exp(knobs, name="part")  # resumes from step 3: rows 1-3 come back from the checkpoint
    assert [json.loads(x)["step"] for x in (part / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5, 6]

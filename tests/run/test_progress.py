"""Progress for long phases: the report rules (bar on a terminal, throttled lines elsewhere, two lines
with progress off), the sweep watch read from a sweep directory (states, steps, ETA), the warm-up's
lines, and the evaluation's progress callback."""

from __future__ import annotations

import io
import json
import os
import re
import time

import pytest
import torch

from prorl_bench.run.progress import PhaseReport, eta_seconds, fmt_duration
from prorl_bench.sweeps import sweepwatch
from tests.conftest import make_config
from tests.sweep_factory import metric_rows, write_multirun_yaml, write_run


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_durations_and_eta_are_exact():
    assert [fmt_duration(s) for s in (0, 12.4, 59.6, 250, 3725)] == ["0s", "12s", "1m00s", "4m10s", "1h02m"]
    assert eta_seconds(done=30, elapsed=60.0, left=90) == 180.0  # 0.5 step/s, 90 steps left
    assert eta_seconds(done=0, elapsed=60.0, left=90) is None  # no rate yet
    assert eta_seconds(done=10, elapsed=5.0, left=-3) == 0.0


def test_phase_report_lines_bar_and_quiet():
    lines = io.StringIO()  # not a terminal: plain lines, throttled (every_s=0: every update)
    r = PhaseReport("warm-up", 100, "step", True, start="go", every_s=0.0, stream=lines)
    r.update(10, "success 0.100/0.3")
    r.update(20, "success 0.200/0.3")
    r.close("done")
    text = lines.getvalue()
    assert "\r" not in text
    got = [x.split(" (")[0] for x in text.splitlines()]
    assert got == [
        "warm-up: go",
        "warm-up: 10/100 steps, success 0.100/0.3",
        "warm-up: 20/100 steps, success 0.200/0.3",
        "warm-up: done",
    ]

    slow = io.StringIO()  # a long throttle: no line between the first and the last
    r = PhaseReport("warm-up", 100, "step", True, start="go", every_s=3600.0, stream=slow)
    r.update(10, "x")
    r.close("done")
    assert len(slow.getvalue().splitlines()) == 2

    quiet = io.StringIO()  # progress off: what started and how it ended, nothing else (even on a TTY)
    r = PhaseReport("warm-up", 100, "step", False, start="go", every_s=0.0, stream=quiet)
    r.update(10, "x")
    r.close("done")
    assert [x.split(" (")[0] for x in quiet.getvalue().splitlines()] == ["warm-up: go", "warm-up: done"]

    tty = Tty()  # a terminal: a bar redrawn in place, showing the position and the status
    r = PhaseReport("warm-up", 100, "step", True, start="go", every_s=0.0, stream=tty)
    r.update(40, "success 0.250/0.3")
    r.bar.refresh()
    r.close("done")
    assert "\r" in tty.getvalue() and "40/100" in tty.getvalue() and "success 0.250/0.3" in tty.getvalue()
    assert "warm-up: 40/100 steps" not in tty.getvalue()  # no plain line where the bar shows it


def _touch_later(path, than):
    t = than.stat().st_mtime_ns + 10**9
    os.utime(path, ns=(t, t))


def test_sweep_watch_reads_states_steps_and_eta(tmp_path):
    """4 jobs of 10 steps: one completed, one failed, one preempted earlier and resumed now (its lock is
    newer than its summary), and one waiting (in multirun.yaml, no directory)."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    write_multirun_yaml(sweep, {"seed": "0,1,2,3"}, [])
    cfg = {"steps": 10}
    write_run(sweep, ["seed=0"], metric_rows([0.1] * 10), summary={"status": "completed"}, config=cfg)
    write_run(sweep, ["seed=1"], metric_rows([0.1] * 2), summary={"status": "failed"}, config=cfg)
    d = write_run(sweep, ["seed=2"], metric_rows([0.1] * 4), summary={"status": "preempted"}, config=cfg)
    assert sweepwatch.job_state(d) == "preempted"
    (d / ".lock").write_text("pid 1")
    _touch_later(d / ".lock", d / "summary.json")  # RunDirLock rewrote it: the resumed job runs now
    assert sweepwatch.job_state(d) == "running"
    assert sweepwatch.job_state(d, ended=True) == "preempted"  # the multirun exited: nothing of it runs

    p = sweepwatch.scan(sweep)
    assert (p.total, p.done, p.running, p.failed, p.preempted, p.waiting) == (4, 1, 1, 1, 0, 1)
    assert (p.steps_done, p.steps_total) == (16, 40)  # the waiting job counts as the mean planned steps
    line = sweepwatch.progress_line(p, elapsed=65.0, eta=eta_seconds(6, 30.0, 40 - 16))
    assert line == ("[prorl-bench-sweep] 1/4 done, 1 running, 1 failed, 1 waiting; 16/40 steps; "
                    "1m05s elapsed, ETA 2m00s")  # fmt: skip
    assert sweepwatch.progress_line(p, 3.0, None).endswith("ETA after the first steps")


def test_sweep_watch_prints_when_counts_change(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    write_multirun_yaml(sweep, {"seed": "0,1"}, [])
    out = io.StringIO()
    watch = sweepwatch.SweepWatch(lambda: sweep, poll_s=0.01, heartbeat_s=3600, stream=out).start()

    def wait_for(text: str) -> None:  # readiness: the watch printed it (no fixed sleep)
        while text not in out.getvalue():
            time.sleep(0.01)

    wait_for("0/2 done, 2 waiting")
    write_run(sweep, ["seed=0"], metric_rows([0.1] * 3), config={"steps": 3})
    wait_for("0/2 done, 1 running, 1 waiting")
    (sweep / "seed=0" / "summary.json").write_text(json.dumps({"status": "completed"}))
    wait_for("1/2 done, 1 waiting")
    watch.stop()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines  # one line per change, none repeated


def test_a_refused_resume_leaves_its_job_completed_once_the_sweep_ends(tmp_path):
    """A resume refused before its first step (the job's config changed since it ran) takes the lock
    (rewriting .lock) and writes no summary. While the multirun runs, that reads as running; once it
    has exited, the summary's status stands: the last line says 1/1 done, not 1 running (seen: a
    refused --resume of a finished 12-job sweep said "12 of 12 jobs unfinished" and offered the same
    command again)."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    write_multirun_yaml(sweep, {"seed": "0"}, [])
    d = write_run(sweep, ["seed=0"], metric_rows([0.1] * 3), summary={"status": "completed"}, config={"steps": 3})
    (d / ".lock").write_text("pid 1")
    _touch_later(d / ".lock", d / "summary.json")
    out = io.StringIO()
    watch = sweepwatch.SweepWatch(lambda: sweep, poll_s=0.01, heartbeat_s=3600, stream=out).start()
    while "0/1 done, 1 running" not in out.getvalue():  # readiness: the live reading
        time.sleep(0.01)
    watch.stop()
    assert out.getvalue().splitlines()[-1].startswith("[prorl-bench-sweep] 1/1 done; 3/3 steps")
    left = sweepwatch.scan(sweep, ended=True)
    assert (left.done, left.running, left.waiting) == (1, 0, 0)


@pytest.mark.slow
def test_warm_up_says_when_it_starts_and_how_it_ended(capsys):
    from prorl_bench.run.base import train_base
    from prorl_bench.run.policies import build_tokenizer
    from prorl_bench.tasks.base import make_task

    cfg = make_config(["warmup.target_success=0.05"])
    state, info = train_base(cfg, make_task(cfg.task), build_tokenizer(cfg), torch.device("cpu"))
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warm-up:")]
    assert len(err) == 2 and "until its sampled success reaches 0.05" in err[0]  # progress off: two lines
    assert err[1].startswith(f"warm-up: done after {info['warmup_steps']} steps, sampled success "
                             f"{info['sampled_success']:.3f}")  # fmt: skip


def test_evaluation_reports_its_progress_in_sequences():
    from prorl_bench.models.model import TransformerPolicy
    from prorl_bench.run.evaluation import validate
    from prorl_bench.run.policies import build_tokenizer
    from prorl_bench.tasks.base import make_task

    cfg = make_config(["task.val_size=5"])
    task, tok = make_task(cfg.task), build_tokenizer(cfg)
    policy = TransformerPolicy(cfg.model, tok.vocab_size)
    calls: list[tuple[int, int]] = []
    validate(
        policy, task, tok, task.val_set(), temperature=1.0, banned=tuple(tok.banned_ids),
        generator=torch.Generator().manual_seed(0), device=torch.device("cpu"), n_samples=4, ks=[1, 4],
        n_sample_prompts=1, chunk=6, on_progress=lambda done, total: calls.append((done, total)),
    )  # fmt: skip
    # 5 prompts x 4 samples = 20 sampled sequences in chunks of 6, then 5 greedy ones: 25 in all
    assert calls == [(6, 25), (12, 25), (18, 25), (20, 25), (25, 25)]


@pytest.mark.slow
def test_the_bar_shows_the_step_0_evaluation(tmp_path, base_cache, capsys):
    from prorl_bench.run.trainer import train
    from tests.conftest import FAST

    train(make_config([*FAST, "steps=1", "eval_every=1"]), tmp_path / "run", base_cache, progress=True)
    err = capsys.readouterr().err
    # the bar at 0/1 says what it waits for, chunk by chunk, up to the last sequence
    shown = re.findall(r"0/1 \[[^\]]*evaluating step 0: (\d+)/(\d+) sequences\]", err)
    assert shown and shown[-1][0] == shown[-1][1], err[-2000:]

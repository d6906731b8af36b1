"""Run lifecycle at its edges: a signal before training starts, Ctrl-C, and a full disk — each leaves
one clear record (summary.json) and one clear message, never a half-written file counted as good."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from prorl_bench.run.outputs import read_jsonl
from tests.conftest import FAST

EXIT_PREEMPTED = 75


def _cli(tmp_path: Path, extra: list[str]) -> list[str]:
    return [
        "-m", "prorl_bench.cli.app", f"run_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}",
        "progress=false", *FAST, *extra,
    ]  # fmt: skip


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _summary(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def _wait(pred) -> None:
    """Poll ``pred`` until it holds (no wall-clock limit: a loaded machine is slow, not wrong; a hung
    process is caught by the caller's checks of ``proc.poll()``)."""
    while not pred():
        time.sleep(0.1)


def _stderr_lines(proc: subprocess.Popen) -> tuple[list[str], threading.Thread]:
    """The process's stderr lines as they arrive, read by a thread until EOF (join it for the rest)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    return lines, reader


@pytest.mark.slow
def test_sigterm_during_the_warm_up_leaves_a_preempted_summary_and_no_cache(tmp_path):
    cache = tmp_path / "cache"
    # a warm-up that cannot finish soon: the signal arrives in the middle of it
    args = _cli(tmp_path, [f"warmup.cache_dir={cache}", "warmup.target_success=1.0", "warmup.max_steps=100000"])
    proc = _start(args, tmp_path)
    # readiness marker, not a fixed sleep: the warm-up's first line (printed once the signal handlers
    # exist: they are installed before the warm-up begins). A 6 s sleep here once fired too early.
    err_lines, reader = _stderr_lines(proc)
    _wait(lambda: any(x.startswith("warm-up: training the base policy") for x in err_lines) or proc.poll() is not None)
    assert proc.poll() is None, "".join(err_lines)[-2000:]
    proc.send_signal(signal.SIGTERM)
    proc.wait()
    reader.join()
    err = "".join(err_lines)
    assert proc.returncode == EXIT_PREEMPTED, err[-2000:]
    assert "Traceback" not in err and "during the warm-up" in err
    summary = _summary(tmp_path)
    assert summary["status"] == "preempted" and "during the warm-up, before step 1" in summary["error"]
    assert summary["steps_completed"] == 0
    assert not list(cache.glob("base-*.pt")), "a half-trained base must not be cached"


@pytest.mark.slow
def test_ctrl_c_during_training_is_a_preemption_with_a_checkpoint(tmp_path, base_cache):
    args = _cli(tmp_path, [f"warmup.cache_dir={base_cache}", "steps=500", "eval_every=100"])
    proc = _start(args, tmp_path)
    metrics = tmp_path / "run" / "metrics.jsonl"
    _wait(lambda: (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2) or proc.poll() is not None)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate()
    assert proc.returncode == EXIT_PREEMPTED, err[-2000:]
    summary = _summary(tmp_path)
    assert summary["status"] == "preempted", summary
    done = summary["steps_completed"]
    assert 2 <= done < 500 and (tmp_path / "run" / "checkpoints" / f"step_{done:08d}.pt").is_file()


INJECT = """
import builtins, errno, sys
import prorl_bench.run.outputs as outputs

class Full:
    # a file on a disk that fills up: the first 100 bytes land, then ENOSPC
    def __init__(self, f): self.f = f
    def __enter__(self): return self
    def __exit__(self, *a): self.f.close()
    def write(self, data):
        self.f.write(data[:100])
        raise OSError(errno.ENOSPC, "No space left on device")

def open_(path, mode="r", *a, **k):
    f = builtins.open(path, mode, *a, **k)
    return Full(f) if "step_00000004" in str(path) and "w" in mode else f

outputs.open = open_
from prorl_bench.cli.app import main
sys.argv = ["prorl-bench", *sys.argv[1:]]
main()
"""


@pytest.mark.slow  # a real CLI run: ~70 s measured under load
def test_a_full_disk_is_one_clear_error_and_no_bad_checkpoint(tmp_path, base_cache):
    args = _cli(tmp_path, [f"warmup.cache_dir={base_cache}", "steps=6", "checkpoint.every=2"])[2:]
    proc = subprocess.run(
        [sys.executable, "-c", INJECT, *args], cwd=tmp_path, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.count("disk full") == 1 and "Traceback" not in proc.stderr
    assert "step_00000004.pt" in proc.stderr
    summary = _summary(tmp_path)
    assert summary["status"] == "failed" and summary["error"].startswith("DiskFull: disk full")
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert ckpts == ["step_00000002.pt", "step_00000002.pt.sha256"], ckpts  # the partial temp file is gone


# Audit item 18: re-running a completed run appended a second `end` event and overwrote wall_time_s
def test_rerunning_a_finished_run_changes_nothing_and_wall_time_adds_up(run_exp):
    summary, d = run_exp(["checkpoint.every=3"], name="r")
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"}
    again, _ = run_exp(["checkpoint.every=3"], name="r")
    assert again == json.loads((d / "summary.json").read_text())
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"} == before
    ends = [e for e in read_jsonl(d / "events.jsonl") if e["event"] == "end"]
    assert len(ends) == 1
    # extending: the wall time is the sum over both segments, not the last one
    longer, _ = run_exp(["checkpoint.every=3", "steps=8"], name="r")
    assert longer["wall_time_s"] > summary["wall_time_s"]
    assert len([e for e in read_jsonl(d / "events.jsonl") if e["event"] == "end"]) == 1

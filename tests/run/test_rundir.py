"""The run directory (run/rundir.py) through the CLI: a refused resume leaves a finished run byte for byte,
and a second process on a directory in use fails at once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FAST

EXE = str(Path(sys.executable).with_name("prorl-bench"))


def _cli(run_dir, cache, *extra, timeout=300):
    cmd = [EXE, *FAST, "progress=false", "hardware.torch_threads=1", f"warmup.cache_dir={cache}"]
    cmd += [f"hydra.run.dir={run_dir}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


# Audit item 2: a refused resume (or any config error) overwrote the finished run's record
@pytest.mark.slow
def test_a_refused_resume_leaves_the_run_untouched(tmp_path, base_cache):
    d = tmp_path / "run"
    assert _cli(d, base_cache, "algo.lr=0.002").returncode == 0
    assert "lr: 0.002" in (d / "config_resolved.yaml").read_text()  # written once the run was accepted
    assert json.loads((d / "summary.json").read_text())["status"] == "completed"
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"}
    for bad in (["algo.lr=0.5"], ["+algo.learning_rate=1"]):  # a refused resume; an unknown key
        r = _cli(d, base_cache, *bad)
        assert r.returncode == 2 and "config" in r.stderr, r.stderr
    after = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"}
    assert after == before  # summary.json, config_resolved.yaml, logs: byte for byte


# Audit item 3: two processes on one run directory raced on its files
@pytest.mark.slow
def test_a_second_process_on_a_run_directory_fails_at_once(tmp_path, base_cache):
    d = tmp_path / "run"
    first = subprocess.Popen(
        [EXE, *FAST, "steps=200", "progress=false", f"warmup.cache_dir={base_cache}", f"hydra.run.dir={d}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while not (d / "metrics.jsonl").exists():  # readiness: the first run is training (no deadline)
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        r = _cli(d, base_cache, "steps=200")
        assert r.returncode == 2 and "in use by pid" in r.stderr and str(first.pid) in r.stderr
        assert first.poll() is None  # "at once": it did not wait for the first run (200 steps) to end
    finally:
        first.kill()
        first.wait()

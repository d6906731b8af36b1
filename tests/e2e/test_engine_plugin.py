"""An engine from the user's own module (docs/extending.md, "Adding an engine"): the file printed there
registers ``wrapped_native`` (the native trainer behind a check of its own); ``plugins=[...]`` makes it
a valid ``engine`` option, selected by the group's name through the real ``prorl-bench`` entry point
from a temporary directory; its ``check`` refuses a config before anything runs; an unknown engine
lists the registered ones, the plugin's included. No package file is edited."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from prorl_bench import registry
from prorl_bench.engines.base import Engine

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
EXE = str(Path(sys.executable).with_name("prorl-bench"))
SMALL = ["algo.prompts_per_step=4", "algo.group_size=4", "task.val_size=8", "eval.n_samples=4", "eval.ks=[1,4]",
         "warmup.target_success=0.05"]  # fmt: skip


def _engine_file() -> str:
    """The engine module of docs/extending.md, as printed."""
    found = re.findall(r"```python\n(# wrapped_native\.py — .*?)```", DOC.read_text(), re.S)
    assert len(found) == 1
    return found[0]


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "PYTHONPATH": str(cwd),
        "PYTHONWARNINGS": "ignore",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run([EXE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    (tmp_path / "wrapped_native.py").write_text(_engine_file())
    return tmp_path


def test_the_docs_engine_registers_an_engine(plugin_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_dir))
    try:
        registry.load_plugins(["wrapped_native"])
        engine = registry.ENGINES["wrapped_native"]
        assert isinstance(engine, Engine)
        assert registry.ENGINES.names()[:2] == ["native", "trl"] and "wrapped_native" in registry.ENGINES
        assert (
            registry.ENGINES.description("wrapped_native")
            == "The native trainer, refusing runs of more than 1000 steps."
        )
    finally:
        registry.ENGINES.remove("wrapped_native")
        sys.modules.pop("wrapped_native", None)


@pytest.mark.slow
def test_a_plugin_engine_runs_from_the_command_line(plugin_dir):
    """``engine=wrapped_native`` (no YAML of its own) trains through the plugin's engine and writes the
    run directory of the contract."""
    args = ["plugins=[wrapped_native]", "engine=wrapped_native", "steps=2", "eval_every=2", "progress=false",
            "hydra.run.dir=run", *SMALL]  # fmt: skip
    proc = _cli(args, plugin_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = plugin_dir / "run"
    assert f"[wrapped_native] training 2 steps into {run}" in proc.stdout
    for name in ("config_resolved.yaml", "metrics.jsonl", "events.jsonl", "validation.jsonl", "samples.jsonl"):
        assert (run / name).is_file(), name
    assert "name: wrapped_native" in (run / "config_resolved.yaml").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_completed"] == 2


def test_the_engines_check_refuses_and_unknown_engines_are_listed(plugin_dir):
    proc = _cli(["plugins=[wrapped_native]", "engine=wrapped_native", "steps=2000"], plugin_dir)
    assert proc.returncode == 2
    assert "invalid config value steps=2000: engine=wrapped_native runs at most 1000" in proc.stderr
    assert not (plugin_dir / "outputs").exists()  # refused before anything was written
    proc = _cli(["plugins=[wrapped_native]", "engine.name=wrapped_nativ"], plugin_dir)
    assert proc.returncode == 2
    assert "invalid config value engine.name='wrapped_nativ': allowed native, trl, wrapped_native" in proc.stderr
    proc = _cli(["plugins=[wrapped_native]", "engine=wrapped_nativ"], plugin_dir)
    assert proc.returncode == 2
    assert "invalid config value engine.name='wrapped_nativ': allowed native, trl, wrapped_native" in proc.stderr
    proc = _cli(["engine=typo"], plugin_dir)  # no plugin: the built-in engines
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == "prorl-bench: config error: invalid config value engine.name='typo': allowed native, trl"
    )

"""Tracking sinks: forwarding through the writer, a clear error without the extra, and real
TensorBoard / W&B-offline files from a short training run (when those extras are installed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from prorl_bench import sinks
from prorl_bench.config import ConfigError, register_configs, to_config
from prorl_bench.searchpath import CONF_DIR

register_configs()
TINY = [
    "steps=3",
    "eval_every=3",
    "algo.prompts_per_step=4",
    "algo.group_size=4",
    "warmup.target_success=0.05",
    "task.val_size=16",
]


def _config(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=overrides))


class Recorder:
    def __init__(self):
        self.rows, self.events, self.closed = [], [], False

    def metrics(self, row):
        self.rows.append(row)

    def event(self, row):
        self.events.append(row)

    def close(self):
        self.closed = True


def test_tee_writer_forwards_rows_and_keeps_jsonl(tmp_path):
    rec = Recorder()
    w = sinks.TeeWriter(tmp_path, [rec])
    w.metrics({"step": 1, "reward/mean": 0.5})
    w.event(1, "reset", "periodic", alpha=1.0)
    w.close()
    assert rec.rows == [{"step": 1, "reward/mean": 0.5}]
    assert rec.events == [{"step": 1, "event": "reset", "reason": "periodic", "alpha": 1.0}]
    assert rec.closed
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1, "reward/mean": 0.5}


def test_sinks_off_by_default_and_missing_extra_is_a_config_error(tmp_path, monkeypatch):
    w = sinks.open_writer(_config([]), tmp_path)
    assert type(w) is sinks.RunWriter
    w.close()
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # "import wandb" now raises ImportError
    with pytest.raises(ConfigError, match=r"tracking.wandb=true needs the 'wandb' extra"):
        sinks.open_writer(_config(["tracking.wandb=true"]), tmp_path / "w")


def _train(tmp_path: Path, overrides: list[str]) -> Path:
    from prorl_bench.trainer import train

    run_dir = tmp_path / "run"
    train(_config(TINY + overrides), run_dir, tmp_path / "cache", threads=1)
    return run_dir


@pytest.mark.slow
def test_tensorboard_sink_writes_the_metrics(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = _train(tmp_path, ["tracking.tensorboard=true"])
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [(e.step, e.value) for e in acc.Scalars("reward/mean")]
    assert logged == [(r["step"], pytest.approx(r["reward/mean"])) for r in rows]
    assert "time/ref_logprob" in acc.Tags()["scalars"]


@pytest.mark.slow
def test_wandb_offline_sink_writes_a_local_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = _train(tmp_path, ["tracking.wandb=true"])
    (offline,) = list((run_dir / "wandb").glob("offline-run-*"))
    (log,) = list(offline.glob("run-*.wandb"))
    data = log.read_bytes()  # W&B's protobuf record log; `wandb sync` uploads it later
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert data.count(b"reward/mean") >= len(rows)  # a history record per RL step (+ summaries)
    assert b"events/start" in data and b"kl_estimator" in data  # events and the run's config
    assert json.dumps(rows[-1]["loss/total"]).encode() in data

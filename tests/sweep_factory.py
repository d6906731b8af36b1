"""Synthetic Hydra multirun directories with known values, for aggregator tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def write_run(
    sweep_dir: Path,
    overrides: list[str],
    metrics: list[dict[str, Any]] | None = None,
    events: list[dict[str, Any]] | None = None,
    validation: list[dict[str, Any]] | None = None,
    summary: dict[str, Any] | None = None,
    resolved: bool = True,
    config: dict[str, Any] | None = None,
) -> Path:
    """One job directory laid out as Hydra + prorl-bench write it (files omitted when None)."""
    run = sweep_dir / ",".join(sorted(o.lstrip("+") for o in overrides))
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if resolved:
        (run / "config_resolved.yaml").write_text(yaml.safe_dump(config if config is not None else {"seed": 0}))
    for name, rows in (("metrics.jsonl", metrics), ("events.jsonl", events), ("validation.jsonl", validation)):
        if rows is not None:
            (run / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    return run


def metric_rows(
    rewards: list[float],
    step_time: float = 0.1,
    ref_time: float = 0.02,
    kl: float | None = 0.5,
    ref_fwd: int = 1,
    ref_tokens: int = 100,
) -> list[dict[str, Any]]:
    """metrics.jsonl rows, steps 1..n, success_rate = reward/mean, constant timers and counters."""
    return [
        {
            "step": i + 1,
            "reward/mean": r,
            "success_rate": r,
            "kl/ref": kl,
            "kl/ref_k1": kl,
            "time/step": step_time,
            "time/rollout": step_time - ref_time,
            "time/ref_logprob": ref_time,
            "count/ref_fwd": ref_fwd,
            "tokens/ref_fwd": ref_tokens,
        }
        for i, r in enumerate(rewards)
    ]


def write_multirun_yaml(sweep_dir: Path, params: dict[str, str], task: list[str]) -> None:
    """multirun.yaml as the basic sweeper saves it (only the keys the aggregator reads)."""
    cfg = {
        "hydra": {
            "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper", "params": params},
            "overrides": {"task": task},
        }
    }
    (sweep_dir / "multirun.yaml").write_text(yaml.safe_dump(cfg))

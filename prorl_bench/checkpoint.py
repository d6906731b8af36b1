"""Checkpoints and resume: everything a run needs to continue *identically* after being killed.

A checkpoint is written at the end of a step, atomically (temp file, fsync, rename), into
``<run_dir>/checkpoints/step_XXXXXXXX.pt``; the last ``keep_last`` are kept. It holds the policy,
the reference, AdamW's full state, the LR schedule, every random generator (Python prompt sampler,
token sampler, minibatch shuffler, torch global), trigger/controller state, adapter rank, the
metrics history and the resolved config.

On resume the JSONL logs are cut back to the checkpoint's step, so every step appears exactly once,
and a checkpoint whose config differs from the current one (apart from ``RESUMABLE_KEYS``) refuses
to load, naming the fields that differ.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from prorl_bench.config import Config, ConfigError
from prorl_bench.outputs import EVENTS, METRICS, SAMPLES, VALIDATION, atomic_write_text, read_jsonl

CKPT_DIR = "checkpoints"
_NAME = re.compile(r"step_(\d{8})\.pt$")
# Keys that may change between the interrupted run and its continuation.
RESUMABLE_KEYS = ("steps", "progress", "run_dir", "hardware.torch_threads", "checkpoint.every", "checkpoint.keep_last")


def config_dict(cfg: Config) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=lambda e: e.value))


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_diff(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Flat keys whose values differ (ignoring RESUMABLE_KEYS), as 'key: saved -> current'."""
    a, b = _flatten(saved), _flatten(current)
    keys = sorted(set(a) | set(b))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys if k not in RESUMABLE_KEYS and a.get(k) != b.get(k)]


def checkpoint_paths(run_dir: Path) -> list[Path]:
    d = Path(run_dir) / CKPT_DIR
    if not d.exists():
        return []
    return sorted(p for p in d.iterdir() if _NAME.search(p.name))


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
    d = Path(run_dir) / CKPT_DIR
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"step_{step:08d}.pt"
    tmp = d / f".step_{step:08d}.pt.tmp"
    with open(tmp, "wb") as f:
        torch.save({"step": step, **state}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in checkpoint_paths(run_dir)[:-keep_last]:
        old.unlink()
    return path


def load_latest(run_dir: Path, cfg: Config) -> dict[str, Any] | None:
    """The newest checkpoint of ``run_dir`` or None. Raises ConfigError if its config differs."""
    paths = checkpoint_paths(run_dir)
    if not paths:
        return None
    blob = torch.load(paths[-1], map_location="cpu", weights_only=False)
    diff = config_diff(blob["config"], config_dict(cfg))
    if diff:
        raise ConfigError(
            f"refusing to resume from {paths[-1]}: its config differs in {len(diff)} field(s): " + "; ".join(diff)
        )
    return blob


def truncate_logs(run_dir: Path, step: int) -> None:
    """Drop JSONL rows written after ``step`` (and a torn last line), atomically per file."""
    for name in (METRICS, EVENTS, VALIDATION, SAMPLES):
        path = Path(run_dir) / name
        if path.exists():
            rows = [r for r in read_jsonl(path) if r["step"] <= step]
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def rng_state(py_rng, sample_gen: torch.Generator, shuffle_gen: torch.Generator) -> dict[str, Any]:
    return {
        "python": py_rng.getstate(),
        "sample": sample_gen.get_state(),
        "shuffle": shuffle_gen.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def restore_rng(state: dict[str, Any], py_rng, sample_gen: torch.Generator, shuffle_gen: torch.Generator) -> None:
    py_rng.setstate(state["python"])
    sample_gen.set_state(state["sample"])
    shuffle_gen.set_state(state["shuffle"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

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

import hashlib
import io
import json
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from prorl_bench.config import Config, ConfigError, as_dict
from prorl_bench.run.outputs import (
    EVENTS,
    METRICS,
    SAMPLES,
    SUMMARY,
    VALIDATION,
    _clean,
    atomic_write_bytes,
    atomic_write_text,
    read_jsonl,
)

CKPT_DIR = "checkpoints"
_NAME = re.compile(r"step_(\d{8})\.pt$")
# Keys that may change between the interrupted run and its continuation.
# Not hardware.torch_threads: float reductions depend on the thread count, so a resume on another
# count would silently continue a different trajectory.
RESUMABLE_KEYS = ("steps", "progress", "run_dir", "checkpoint.every", "checkpoint.keep_last")


def config_dict(cfg: Config) -> dict[str, Any]:
    return json.loads(json.dumps(as_dict(cfg), default=lambda e: e.value))  # options' parameters: flat keys


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


class CorruptFileError(RuntimeError):
    """A checkpoint or cached base that fails its checksum or cannot be loaded safely (file named)."""


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def save_verified(path: Path, obj: Any) -> None:
    """torch.save ``obj`` atomically, then its SHA-256 next to it (``<file>.sha256``), also atomically.

    The digest is written last: a kill between the two leaves a file without a digest, which
    ``load_verified`` refuses — exactly right for a half-finished save.
    """
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    atomic_write_bytes(path, data)
    atomic_write_text(_digest_path(path), hashlib.sha256(data).hexdigest() + "\n")


def load_verified(path: Path) -> Any:
    """Load a file written by ``save_verified``: the SHA-256 must match and unpickling is restricted
    to tensors and plain containers (``weights_only=True``: a planted pickle cannot run code).
    Every failure raises CorruptFileError naming the file."""
    digest = _digest_path(path)
    if not digest.is_file():
        raise CorruptFileError(
            f"{path}: no checksum file {digest.name} (an interrupted save, or not written by prorl-bench)"
        )
    data = path.read_bytes()
    want = digest.read_text().strip()
    if hashlib.sha256(data).hexdigest() != want:
        raise CorruptFileError(f"{path}: SHA-256 mismatch ({len(data)} bytes; the file was changed or truncated)")
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:
        raise CorruptFileError(f"{path}: cannot be loaded safely ({type(e).__name__}: {e})") from e


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep_last: int) -> Path:
    d = Path(run_dir) / CKPT_DIR
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"step_{step:08d}.pt"
    save_verified(path, {"step": step, **state})
    for old in checkpoint_paths(run_dir)[:-keep_last]:
        old.unlink()
        _digest_path(old).unlink(missing_ok=True)
    return path


def load_latest(run_dir: Path, cfg: Config) -> dict[str, Any] | None:
    """The newest intact checkpoint of ``run_dir`` or None. A checkpoint that fails its checksum or
    safe loading is skipped with a warning naming it (the next older one is used). Raises
    ConfigError if the chosen checkpoint's config differs."""
    blob, paths = None, checkpoint_paths(run_dir)
    for path in reversed(paths):
        try:
            blob = load_verified(path)
            break
        except CorruptFileError as e:
            warnings.warn(f"skipping a damaged checkpoint: {e}", stacklevel=2)
    if blob is None:
        if paths:
            raise CorruptFileError(
                f"{run_dir}: every checkpoint is damaged ({', '.join(p.name for p in paths)}); "
                "move them away to start this run afresh"
            )
        return None
    diff = config_diff(blob["config"], config_dict(cfg))
    if diff:
        raise ConfigError(
            f"refusing to resume from {run_dir / CKPT_DIR} (step {blob['step']}): "
            f"its config differs in {len(diff)} field(s): " + "; ".join(diff)
        )
    return blob


def truncate_logs(run_dir: Path, step: int) -> None:
    """Drop JSONL rows written after ``step`` (and a torn last line), atomically per file."""
    for name in (METRICS, EVENTS, VALIDATION, SAMPLES):
        path = Path(run_dir) / name
        if path.exists():
            rows = [r for r in read_jsonl(path) if r["step"] <= step]
            atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def rewrite_logs(run_dir: Path, history: list[dict[str, Any]], val_rows: list[dict[str, Any]]) -> None:
    """metrics.jsonl and validation.jsonl as the checkpoint records them (atomically per file), and
    events.jsonl without an earlier `end` event."""
    for name, rows in ((METRICS, history), (VALIDATION, val_rows)):
        atomic_write_text(Path(run_dir) / name, "".join(json.dumps(_clean(r)) + "\n" for r in rows))
    events = Path(run_dir) / EVENTS
    if events.exists():  # an extended run is not over: its one `end` event comes when it is
        kept = [r for r in read_jsonl(events) if r.get("event") != "end"]
        atomic_write_text(events, "".join(json.dumps(r) + "\n" for r in kept))


def finished_summary(run_dir: Path, steps: int) -> dict[str, Any] | None:
    """The summary of a run that already completed ``steps`` steps (None when it did not)."""
    path = Path(run_dir) / SUMMARY
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if summary.get("status") == "completed" and summary.get("steps_completed") == steps:
        return summary
    return None


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

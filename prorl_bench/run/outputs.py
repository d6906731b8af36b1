"""Run-directory files: metrics.jsonl, events.jsonl, validation.jsonl, summary.json.

Each JSONL row is written with a single ``write`` of a complete line and flushed, so a reader sees
whole rows. Non-finite floats are written as null (JSON has no NaN). summary.json is replaced
atomically (temp file, fsync, rename) so it is never half-written.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

from prorl_bench.run import provenance

METRICS, EVENTS, VALIDATION, SUMMARY = "metrics.jsonl", "events.jsonl", "validation.jsonl", "summary.json"
SAMPLES = "samples.jsonl"  # held-out prompts with every sampled completion, at each evaluation
RESOLVED_CONFIG = "config_resolved.yaml"
# a finished run's summary and config, kept while an extension of it runs (prorl_bench/run/record.py)
FINISHED_SUMMARY, FINISHED_CONFIG = "summary.completed.json", "config_resolved.completed.yaml"
# the timed stages of a step (metrics key time/<stage>) and the forward counters (run/accounting.py);
# here, torch-free, so that readers of run directories (the aggregator, its figures) need no torch
STAGES = ("rollout", "reward", "old_logprob", "ref_logprob", "update", "reset", "growth", "eval")
COUNTERS = ("count/policy_fwd", "count/ref_fwd", "tokens/policy_fwd", "tokens/ref_fwd")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``path`` through a temp file and a rename: readers see the old or the new file, never a
    part. On failure (a full disk) the temp file is removed and the OSError names ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from None


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """``summary.json``; inside ``provenance.recording`` it carries the run's provenance (key ``provenance``)."""
    prov = provenance.current()
    if prov is not None and "provenance" not in summary:
        summary = {**summary, "provenance": prov}
    atomic_write_text(Path(run_dir) / SUMMARY, json.dumps(_clean(summary), indent=2) + "\n")


class RunWriter:
    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._files = {name: open(self.dir / name, "a") for name in (METRICS, EVENTS, VALIDATION, SAMPLES)}

    def _write(self, name: str, row: dict[str, Any]) -> None:
        f = self._files[name]
        try:
            f.write(json.dumps(_clean(row)) + "\n")
            f.flush()
        except OSError as e:  # name the file (a write on an open file reports none)
            raise OSError(e.errno, e.strerror, str(self.dir / name)) from None

    def metrics(self, row: dict[str, Any]) -> None:
        self._write(METRICS, row)

    def event(self, step: int, event: str, reason: str, **details: Any) -> None:
        self._write(EVENTS, {"step": step, "event": event, "reason": reason, **details})

    def validation(self, row: dict[str, Any]) -> None:
        self._write(VALIDATION, row)

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._write(SAMPLES, {"step": step, **row})

    def summary(self, summary: dict[str, Any]) -> None:
        write_summary(self.dir, summary)

    def close(self) -> None:
        for f in self._files.values():
            f.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a torn (incomplete) last line is dropped."""
    rows = []
    if not Path(path).exists():
        return rows
    lines = Path(path).read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                warnings.warn(f"{path}: dropped a torn last line ({len(line)} chars): {line[:60]!r}", stacklevel=2)
                break
            raise ValueError(f"{path}, line {i + 1}: not valid JSON ({e.msg}): {line[:80]!r}") from e
    return rows

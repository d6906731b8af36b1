"""An existing run's record must survive a restart that does not get as far as a new step.

``prorl-bench`` takes a byte snapshot of the record files of a run directory that already holds a run,
before the trainer touches it. If the restart ends in any error before it logs a new step (a refused resume:
a config error, every checkpoint damaged, a guard tripping on the first step, Ctrl-C during the model load),
the files are put back byte-identical and no ``failed`` summary is written: the run is as it was.

Extending a finished run (``steps=9`` on a run that completed 6) first copies its summary and resolved
config to ``summary.completed.json`` and ``config_resolved.completed.yaml``. If the extension then fails after
new steps, ``summary.json`` says so, and the finished 6-step segment stays readable: the aggregator
(``sweepdir.load_run``) reads it from those files and the first 6 rows of the logs. A completed extension
removes them (its own record contains the segment).
"""

from __future__ import annotations

import json
import os
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prorl_bench.run.outputs import (
    EVENTS,
    FINISHED_CONFIG,
    FINISHED_SUMMARY,
    METRICS,
    RESOLVED_CONFIG,
    SAMPLES,
    SUMMARY,
    VALIDATION,
    atomic_write_bytes,
    read_jsonl,
)

RECORD_FILES = (SUMMARY, RESOLVED_CONFIG, METRICS, EVENTS, VALIDATION, SAMPLES)


def failed_summary(error: BaseException) -> dict[str, Any]:
    """The ``summary.json`` of a run that ended in ``error`` (a single run, or a dropped population member)."""
    return {
        "status": "failed",
        "error": f"{type(error).__name__}: {error}",
        "traceback": "".join(traceback.format_exception(error)),
    }


def _last_step(path: Path) -> int:
    try:
        rows = read_jsonl(path)
    except (ValueError, UnicodeDecodeError):
        return -1
    return max((r["step"] for r in rows if isinstance(r, dict) and isinstance(r.get("step"), int)), default=-1)


@dataclass
class RecordSnapshot:
    """The bytes of every record file of ``run_dir`` (None: absent) and the last logged step."""

    run_dir: Path
    files: dict[str, bytes | None]
    last_step: int
    kept_finished: bool = False  # this process wrote the FINISHED_* copies

    @classmethod
    def take(cls, run_dir: Path) -> RecordSnapshot:
        run_dir = Path(run_dir)
        files = {name: (run_dir / name).read_bytes() if (run_dir / name).is_file() else None for name in RECORD_FILES}
        return cls(run_dir, files, _last_step(run_dir / METRICS))

    def summary(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.files[SUMMARY] or b"null")
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def new_steps_logged(self) -> bool:
        """Whether the restart has logged a step beyond the snapshot's last one."""
        return _last_step(self.run_dir / METRICS) > self.last_step

    def keep_finished(self, steps: int) -> None:
        """Before extending a finished run to ``steps``: copy its summary and config beside the live ones
        (an earlier failed extension's copies are kept: they already hold the finished segment)."""
        s = self.summary()
        done = s.get("steps_completed") if s else None
        if not (s and s.get("status") == "completed" and isinstance(done, int) and steps > done):
            return
        if (self.run_dir / FINISHED_SUMMARY).exists():
            return
        if self.files[RESOLVED_CONFIG] is not None:
            atomic_write_bytes(self.run_dir / FINISHED_CONFIG, self.files[RESOLVED_CONFIG])
        atomic_write_bytes(self.run_dir / FINISHED_SUMMARY, self.files[SUMMARY])
        self.kept_finished = True

    def restore(self) -> None:
        """Put every record file back as it was (removing the ones that did not exist)."""
        for name, data in self.files.items():
            path = self.run_dir / name
            if data is None:
                path.unlink(missing_ok=True)
            elif not path.is_file() or path.read_bytes() != data:
                atomic_write_bytes(path, data)
        if self.kept_finished:
            for name in (FINISHED_SUMMARY, FINISHED_CONFIG):
                (self.run_dir / name).unlink(missing_ok=True)


def drop_finished_copies(run_dir: Path) -> None:
    """After an extension completed: its own record now holds the finished segment."""
    for name in (FINISHED_SUMMARY, FINISHED_CONFIG):
        try:
            os.unlink(Path(run_dir) / name)
        except FileNotFoundError:
            pass

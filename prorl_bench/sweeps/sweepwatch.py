"""A running sweep's progress, read from its directory: jobs done / running / failed / preempted /
waiting, RL steps logged against planned, and an ETA.

``prorl-bench-sweep`` runs ``SweepWatch`` beside the multirun: it prints one line whenever a job
starts or ends, and every ``heartbeat_s`` seconds while jobs run, e.g.

    [prorl-bench-sweep] 3/12 done, 2 running, 1 failed, 6 waiting; 640/1200 steps; 4m10s elapsed, ETA 3m20s

Everything is read from the files the jobs write (no message passing; any launcher works):

* a job with ``summary.json`` has ended (completed / failed / preempted) — unless its ``.lock`` is
  newer: the run directory was taken again by a resumed job (``rundir.RunDirLock`` rewrites the lock
  file when a run starts), which is running now. Once the multirun has exited (``ended``), nothing of
  it runs: a newer lock then marks a start that wrote no new summary (a resume refused because the
  job's config changed, or a process killed at once), and the summary's status stands;
* a job directory without ``summary.json`` is running (warming up, or logging steps);
* a job of the grid (``multirun.yaml``) without a directory is waiting.

Steps: rows of ``metrics.jsonl`` against ``steps`` of the job's ``config_resolved.yaml`` (a job not
started yet counts as the mean of the known ones). The ETA extrapolates the rate of steps logged
since the first step this watch saw (a resumed sweep's earlier steps and the warm-up do not count as
speed); until then it reads "ETA after the first steps".
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import yaml

from prorl_bench.run.outputs import METRICS, RESOLVED_CONFIG, SUMMARY
from prorl_bench.run.progress import eta_seconds, fmt_duration
from prorl_bench.run.rundir import LOCK_FILE
from prorl_bench.sweeps.sweepdir import expected_jobs, find_run_dirs


@dataclass(frozen=True)
class SweepProgress:
    """Job counts (``total`` = the grid's size) and RL steps logged / planned over all jobs."""

    total: int
    done: int = 0
    running: int = 0
    failed: int = 0
    preempted: int = 0
    steps_done: int = 0
    steps_total: int = 0

    @property
    def waiting(self) -> int:
        return max(0, self.total - self.done - self.running - self.failed - self.preempted)

    def counts(self) -> tuple[int, ...]:
        return (self.total, self.done, self.running, self.failed, self.preempted)


def job_state(run_dir: Path, ended: bool = False) -> str:
    """``completed`` | ``failed`` | ``preempted`` | ``running`` for one job directory (see above;
    ``ended``: the multirun has exited)."""
    summary, lock = run_dir / SUMMARY, run_dir / LOCK_FILE
    try:
        ended_ns = summary.stat().st_mtime_ns
    except FileNotFoundError:
        return "running"
    try:
        if lock.stat().st_mtime_ns > ended_ns and not ended:
            return "running"  # a resumed job holds the directory; the summary is its previous segment's
    except FileNotFoundError:
        pass
    try:
        return str(json.loads(summary.read_text()).get("status", "failed"))
    except (OSError, json.JSONDecodeError):  # being replaced right now (atomic rename): still ending
        return "running"


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def _planned_steps(run_dir: Path) -> int | None:
    try:
        return int((yaml.safe_load((run_dir / RESOLVED_CONFIG).read_text()) or {})["steps"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return None


def scan(sweep_dir: Path, total_hint: int | None = None, ended: bool = False) -> SweepProgress:
    """The sweep's progress now. ``total_hint``: the number of jobs, when the caller knows it (else
    the grid in ``multirun.yaml``, else the directories found); ``ended``: the multirun has exited."""
    dirs = find_run_dirs(sweep_dir) if sweep_dir.is_dir() else []
    states = [job_state(d, ended) for d in dirs]
    planned = [_planned_steps(d) for d in dirs]
    known = [p for p in planned if p is not None]
    grid = total_hint or len(expected_jobs(sweep_dir) or []) or len(dirs)
    total = max(grid, len(dirs))
    mean_steps = sum(known) / len(known) if known else 0
    return SweepProgress(
        total=total,
        done=states.count("completed"),
        running=states.count("running"),
        failed=states.count("failed"),
        preempted=states.count("preempted"),
        steps_done=sum(_count_lines(d / METRICS) for d in dirs),
        steps_total=round(sum(known) + mean_steps * (total - len(known))),
    )


def progress_line(p: SweepProgress, elapsed: float, eta: float | None) -> str:
    """One status line (see the module docstring); zero counts other than done are left out.
    ``elapsed``, ``eta``: seconds (``eta`` None: no rate measured yet)."""
    parts = [f"{p.done}/{p.total} done"]
    parts += [f"{n} {what}" for n, what in ((p.running, "running"), (p.failed, "failed"),
                                           (p.preempted, "preempted"), (p.waiting, "waiting")) if n]  # fmt: skip
    line = ", ".join(parts)
    if p.steps_total:
        line += f"; {p.steps_done}/{p.steps_total} steps"
    line += f"; {fmt_duration(elapsed)} elapsed"
    if p.running or p.waiting:
        line += f", ETA {fmt_duration(eta)}" if eta is not None else ", ETA after the first steps"
    return f"[prorl-bench-sweep] {line}"


class SweepWatch:
    """A daemon thread printing ``progress_line`` for ``sweep_dir`` (once known: ``locate()`` returns
    it or None) when the job counts change and every ``heartbeat_s`` seconds; ``stop()`` prints the
    last line."""

    def __init__(
        self, locate, total_hint: int | None = None, poll_s: float = 1.0, heartbeat_s: float = 60.0,
        stream: TextIO | None = None,
    ) -> None:  # fmt: skip
        self.locate, self.total_hint, self.poll_s, self.heartbeat_s = locate, total_hint, poll_s, heartbeat_s
        self.stream = stream if stream is not None else sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="sweep-watch")
        self._t0 = time.perf_counter()
        self._base: tuple[float, int] | None = None  # (time, steps) when this watch first saw steps grow
        self._start_steps: int | None = None
        self._last: tuple[int, ...] | None = None
        self._last_t = 0.0
        self._dir: Path | None = None

    def start(self) -> SweepWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread once the multirun has exited; print a last line if the counts changed since
        the last one (read as ``scan(..., ended=True)``: no job of an exited multirun is running)."""
        self._stop.set()
        self._thread.join()
        if self._dir is None:
            self._dir = self.locate()
        if self._dir is not None:
            self._report(ended=True)  # called once the multirun has exited

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self._dir is None:
                self._dir = self.locate()
                if self._dir is None:
                    continue
            self._report()

    def _report(self, ended: bool = False) -> None:
        try:
            p = scan(self._dir, self.total_hint, ended)
        except Exception:  # a directory mid-write must never take the sweep down: try again next poll
            return
        now = time.perf_counter()
        if self._start_steps is None:
            self._start_steps = p.steps_done
        if self._base is None and p.steps_done > self._start_steps:
            self._base = (now, p.steps_done)
        eta = None
        if self._base is not None:
            eta = eta_seconds(p.steps_done - self._base[1], now - self._base[0], p.steps_total - p.steps_done)
        due = p.running and now - self._last_t >= self.heartbeat_s
        if p.counts() != self._last or due:
            self._last, self._last_t = p.counts(), now
            print(progress_line(p, now - self._t0, eta), file=self.stream, flush=True)

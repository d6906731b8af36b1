"""How many torch threads a run uses when ``hardware.torch_threads`` is null, and why.

A single run takes the CPUs this process may run on (``os.sched_getaffinity``: a ``taskset``, a
cgroup cpuset, a SLURM allocation — not ``os.cpu_count()``, which counts the whole machine), capped
by ``OMP_NUM_THREADS`` when the user set it: both are how a shared machine tells a program to use
less of it. A multirun job takes one thread (the joblib launcher runs one job per core). The run
prints the choice and its source at start ("torch threads: 2 (from the CPU affinity: 2 CPUs)").
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS / Windows: no affinity call
        return os.cpu_count() or 1


def _omp(environ: Mapping[str, str]) -> tuple[int | None, str | None]:
    """OMP_NUM_THREADS as a positive int (its first level, as OpenMP reads "4,2"), or a note why not."""
    raw = environ.get("OMP_NUM_THREADS")
    if raw is None or not raw.strip():
        return None, None
    first = raw.split(",")[0].strip()
    if first.isdigit() and int(first) >= 1:
        return int(first), None
    return None, f"OMP_NUM_THREADS={raw!r} ignored: not a positive integer"


def resolve_threads(
    configured: int | None, multirun: bool, environ: Mapping[str, str] | None = None, cpus: int | None = None
) -> tuple[int, str]:
    """(torch threads, where the number came from). ``configured``: ``hardware.torch_threads``;
    ``environ``/``cpus`` default to this process's environment and :func:`available_cpus`."""
    if configured is not None:
        return configured, "hardware.torch_threads"
    if multirun:
        return 1, "one per multirun job; hardware.torch_threads overrides"
    env = os.environ if environ is None else environ
    n_cpus = available_cpus() if cpus is None else cpus
    omp, note = _omp(env)
    if omp is not None and omp <= n_cpus:
        return omp, f"OMP_NUM_THREADS={omp}"
    if omp is not None:
        return n_cpus, f"OMP_NUM_THREADS={omp} capped at the CPU affinity: {n_cpus} CPUs"
    source = f"the CPU affinity: {n_cpus} CPU{'s' if n_cpus > 1 else ''}"
    return n_cpus, source + (f"; {note}" if note else "")

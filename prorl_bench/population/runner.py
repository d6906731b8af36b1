"""Run a population: S configurations that differ only in seed, as one lockstep computation.

``run_population(jobs, cache_root)`` trains every member with the project's own ``trainer.train``
(population/lockstep.py batches their sampling), each into its own ordinary run directory. A member
that fails (a guard, a bad checkpoint) is dropped: its ``summary.json`` says ``failed`` with the error
and ``population.dropped: true``, and the others go on. ``population_blockers`` says why a config
cannot join a population, naming the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prorl_bench.config import AdapterKind, Config, ConfigError, GrowthKind, ModelKind
from prorl_bench.population.lockstep import Lockstep
from prorl_bench.run import provenance
from prorl_bench.run.checkpoint import _flatten, config_dict
from prorl_bench.run.outputs import write_summary
from prorl_bench.run.record import failed_summary
from prorl_bench.run.rundir import RunDirBusy, has_previous_run
from prorl_bench.run.signals import Preempted

# Keys members may differ in: the seeds, and where and how a run reports.
MEMBER_KEYS = ("seed", "warmup.seed", "run_dir", "progress")


@dataclass
class MemberJob:
    """One member: its validated config, run directory and resolved YAML (written once accepted)."""

    cfg: Config
    run_dir: Path
    resolved_config: str | None = None


def population_blockers(cfg: Config) -> list[str]:
    """Why ``cfg`` cannot be batched into a population (empty: it can), each naming the key."""
    out = []
    if cfg.engine.name != "native":
        out.append(f"engine={cfg.engine.name}: populations batch the native trainer only")
    if cfg.model.kind != ModelKind.native:
        out.append(f"model.kind={cfg.model.kind.value}: populations batch the native transformer only")
    if cfg.adapter.kind != AdapterKind.none:
        out.append(f"adapter={cfg.adapter.kind.value}: adapters are not batched")
    if cfg.growth.kind != GrowthKind.none:
        out.append(f"growth={cfg.growth.kind.value}: shape-changing growth is refused for populations")
    if cfg.model.positions != "learned":  # StackedPolicy counts positions from the row start only
        out.append(f"model.positions={cfg.model.positions}: the batched sampler supports learned positions only")
    if cfg.model.dropout > 0:
        out.append(f"model.dropout={cfg.model.dropout}: the batched sampler has no dropout (0 is required)")
    return out


def member_differences(a: Config, b: Config) -> list[str]:
    """Keys (dotted) whose values differ between two configs, other than ``MEMBER_KEYS``."""
    fa, fb = _flatten(config_dict(a)), _flatten(config_dict(b))
    keys = sorted(set(fa) | set(fb))
    return [k for k in keys if k not in MEMBER_KEYS and fa.get(k) != fb.get(k)]


def check_population(jobs: list[MemberJob]) -> None:
    """Raise ConfigError unless the jobs can train as one population (the message names the key)."""
    if not jobs:
        raise ConfigError("a population needs at least one member")
    for job in jobs:
        blockers = population_blockers(job.cfg)
        if blockers:
            raise ConfigError(f"{job.run_dir}: cannot join a population: " + "; ".join(blockers))
        diff = member_differences(jobs[0].cfg, job.cfg)
        if diff:
            raise ConfigError(
                f"population members may differ only in {', '.join(MEMBER_KEYS)}; {job.run_dir} differs from "
                f"{jobs[0].run_dir} in {', '.join(diff[:5])}"
            )
    dirs = [Path(j.run_dir).resolve() for j in jobs]
    dup = sorted({str(d) for d in dirs if dirs.count(d) > 1})
    if dup:
        raise ConfigError(f"population members share a run directory: {dup[0]}")


def prepare_bases(cfgs: list[Config], cache_root: Path, threads: int = 1) -> None:
    """Build (or load) every member's warm-up base in the calling thread, before the members start.

    A member building the base inside its own thread would hold the base's file lock while its
    warm-up samples — a barrier — and the next member, given the run token, would wait on that lock
    for ever. Built here, every member finds its base in the cache (bases are keyed by everything
    that determines them, so this is the base each single run would build or load).
    """
    import torch

    from prorl_bench.run.hardware import resolve_device
    from prorl_bench.run.policies import build_tokenizer, load_base_policy
    from prorl_bench.tasks.base import make_task

    torch.set_num_threads(threads)
    done: set[str] = set()
    for cfg in cfgs:
        key = json.dumps([config_dict(cfg)[k] for k in ("task", "model", "warmup", "algo")], sort_keys=True)
        if key in done:
            continue
        done.add(key)
        task = make_task(cfg.task)
        if cfg.algo.max_new_tokens is not None:
            task.max_completion_len = cfg.algo.max_new_tokens
        load_base_policy(cfg, task, build_tokenizer(cfg), resolve_device(cfg), cache_root)


def run_population(
    jobs: list[MemberJob], cache_root: Path, threads: int = 1, stop_file: Path | None = None
) -> list[dict[str, Any] | BaseException]:
    """Train every member; return each one's summary, or the exception that ended it.

    ``stop_file``: when it appears, every member checkpoints at its next step end and stops
    (``Preempted``), as a sweep's STOP file stops its jobs; re-running the same jobs resumes them.
    """
    from prorl_bench.run.trainer import train

    check_population(jobs)
    prepare_bases([j.cfg for j in jobs], cache_root, threads)

    def member(job: MemberJob):
        def fn() -> dict[str, Any]:
            with provenance.recording(provenance.collect(threads=threads)):  # each member thread its own
                return train_member(job)

        def train_member(job: MemberJob) -> dict[str, Any]:
            had_run = has_previous_run(job.run_dir)
            try:
                return train(job.cfg, job.run_dir, cache_root, threads=threads, progress=False,
                             resolved_config=job.resolved_config, stop_file=stop_file)  # fmt: skip
            except Preempted:
                raise  # the trainer wrote the checkpoint and a "preempted" summary
            except BaseException as e:
                _record_dropped(e, job.run_dir, had_run, len(jobs))
                raise

        return fn

    pop = Lockstep(len(jobs))
    results = pop.run([member(j) for j in jobs])
    run_population.last_stats = dict(pop.stats)  # for tests and the benchmark
    return results


def _record_dropped(e: BaseException, run_dir: Path, had_run: bool, size: int) -> None:
    """A failed member's summary (as ``app.run`` writes one), marked as dropped from its population —
    unless writing would overwrite another run's record (a busy directory, a refused resume)."""
    if isinstance(e, RunDirBusy) or (isinstance(e, ConfigError) and had_run):
        return
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    summary = failed_summary(e)
    summary["population"] = {"dropped": True, "size": size, "why": f"{type(e).__name__}: {e}"}
    write_summary(run_dir, summary)

"""A Hydra launcher that trains a multirun's jobs which differ only in seed as populations.

``prorl-bench -m seed=0,1,2,3 opt_reset=keep,hard hydra/launcher=population`` (or
``prorl-bench-sweep +sweep=NAME hydra/launcher=population``): jobs whose overrides are equal once
``seed=``/``warmup.seed=`` are removed form a group; a group is cut into populations of at most
``hydra.launcher.size`` members; populations and the jobs that cannot be batched (HF models,
adapters, growth, dropout: ``runner.population_blockers`` names the key) run in
``hydra.launcher.n_jobs`` worker processes (loky, as the joblib launcher). Inside a population every
member is an ordinary Hydra job — ``run_job`` with the project's task function, in a lockstep member
thread (prorl_bench/population/lockstep.py) — so its run directory, ``.hydra/`` files, summary and
failure handling are a single job's. Re-running the same command (same ``hydra.sweep.dir``) resumes
every member from its checkpoint, as for any sweep.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict, read_write

log = logging.getLogger(__name__)

SEED_KEYS = ("seed", "warmup.seed")


class PopulationLauncher(Launcher):
    def __init__(self, size: int = 16, n_jobs: int = 2, dry_run: bool = False) -> None:
        if size < 1 or n_jobs < 1:
            raise ValueError(f"hydra.launcher.size={size} and hydra.launcher.n_jobs={n_jobs} must be >= 1")
        self.size, self.n_jobs, self.dry_run = size, n_jobs, dry_run
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from joblib import Parallel, delayed

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        jobs = [(initial_job_idx + i, list(o)) for i, o in enumerate(job_overrides)]
        units = plan(self.hydra_context, self.config, jobs, self.size)
        for line in describe(units):
            log.info(line)
        if self.dry_run:
            print("\n".join(describe(units)))
            raise SystemExit(0)
        state = Singleton.get_state()
        done = Parallel(n_jobs=self.n_jobs, backend="loky")(
            delayed(run_unit)(members, self.hydra_context, self.config, self.task_function, state)
            for members, _ in units
        )
        by_idx = {idx: ret for unit in done for idx, ret in unit}
        return [by_idx[idx] for idx, _ in jobs]


def _group_key(overrides: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted(o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in SEED_KEYS))


def plan(hydra_context: HydraContext, config: DictConfig, jobs: list[tuple[int, list[str]]], size: int):
    """[(members [(job idx, overrides)], why not batched or None)]: populations of up to ``size``
    jobs that differ only in seed, and solo jobs with the reason they cannot join one.

    Populations are filled up to ``size`` even when that leaves a worker without one: on the loaded
    2-core machine one population of 4 in one worker took 87 s against 174 s for two populations of 2
    in two workers and 148 s for joblib (docs/populations.md)."""
    from prorl_bench.config import to_config
    from prorl_bench.population.runner import member_differences, population_blockers

    groups: dict[tuple[str, ...], list[tuple[int, list[str], Any]]] = {}
    units: list[tuple[list[tuple[int, list[str]]], str | None]] = []
    for idx, overrides in jobs:
        sweep_cfg = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        try:
            task = copy.deepcopy(sweep_cfg)
            with read_write(task), open_dict(task):
                del task["hydra"]
            cfg = to_config(task)
        except Exception as e:  # the job fails as a single job would, with its own error
            units.append(([(idx, overrides)], f"config does not validate ({type(e).__name__})"))
            continue
        why = population_blockers(cfg)
        if sweep_cfg.hydra.job.get("chdir"):
            why.append("hydra.job.chdir=true: members share one process and its working directory")
        if why:
            units.append(([(idx, overrides)], "; ".join(why)))
        else:
            groups.setdefault(_group_key(overrides), []).append((idx, overrides, cfg))
    for members in groups.values():
        # the overrides said "same but seed"; the composed configs must agree (interpolations, grids)
        first = members[0][2]
        same = [m for m in members if not member_differences(first, m[2])]
        for m in members:
            if m not in same:
                units.append(
                    ([(m[0], m[1])], "differs from its group in " + ", ".join(member_differences(first, m[2])))
                )
        n_chunks = -(-len(same) // size)  # as few populations as the size allows, of near-equal sizes
        for k in range(n_chunks):
            chunk = same[k::n_chunks]
            units.append(([(i, o) for i, o, _ in chunk], None if len(chunk) > 1 else "alone in its group"))
    return units


def describe(units) -> list[str]:
    """One line per population or solo job (what the dry run prints)."""
    lines = []
    for members, why in units:
        jobs = " | ".join(f"#{i} {' '.join(filter_overrides(o))}" for i, o in members)
        if why is None:
            lines.append(f"population of {len(members)}: {jobs}")
        else:
            lines.append(f"single job ({why}): {jobs}")
    n_pop = sum(1 for _, why in units if why is None)
    lines.append(f"{n_pop} populations, {len(units) - n_pop} single jobs")
    return lines


def _job_config(hydra_context: HydraContext, config: DictConfig, idx: int, overrides: list[str]) -> DictConfig:
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    return sweep_config


def run_unit(members, hydra_context, config, task_function, singleton_state) -> list[tuple[int, JobReturn]]:
    """In a worker process: run one population (lockstep member threads) or one single job."""
    from prorl_bench.population.lockstep import Lockstep
    from prorl_bench.run.signals import ignore_stop_signals_between_jobs

    # member threads cannot install signal handlers: SIGTERM/SIGINT to this worker are left to the
    # sweep's STOP file, which every member checks at its step end (checkpoint, then "preempted")
    ignore_stop_signals_between_jobs()
    setup_globals()
    Singleton.set_state(singleton_state)

    def job(idx: int, overrides: list[str]):
        def fn() -> JobReturn:
            sweep_config = _job_config(hydra_context, config, idx, overrides)
            HydraConfig.instance().set_config(sweep_config)
            return run_job(hydra_context=hydra_context, config=sweep_config, task_function=task_function,
                           job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")  # fmt: skip

        return fn

    if len(members) == 1:
        idx, overrides = members[0]
        return [(idx, job(idx, overrides)())]
    _prepare_bases(hydra_context, config, members)
    results = Lockstep(len(members)).run([job(i, o) for i, o in members])
    out = []
    for (idx, _), ret in zip(members, results):
        if isinstance(ret, BaseException):  # Hydra's run_job itself failed: report it as the job's failure
            err, ret = ret, JobReturn()
            from hydra.core.utils import JobStatus

            ret.status, ret.return_value = JobStatus.FAILED, err
        else:
            _mark_dropped(ret, len(members))
        out.append((idx, ret))
    return out


def _prepare_bases(hydra_context: HydraContext, config: DictConfig, members) -> None:
    """Warm-up bases built before the member threads start (``runner.prepare_bases`` says why); the
    cache directory resolves as ``app.run`` resolves it (relative to the launch directory)."""
    from prorl_bench.config import to_config
    from prorl_bench.population.runner import prepare_bases

    by_root: dict[Path, list] = {}
    for idx, overrides in members:
        sweep_config = _job_config(hydra_context, config, idx, overrides)
        task = copy.deepcopy(sweep_config)
        with read_write(task), open_dict(task):
            del task["hydra"]
        try:
            cfg = to_config(task)
        except Exception:  # noqa: BLE001 - the job itself reports its config error
            continue
        root = Path(cfg.warmup.cache_dir)
        if not root.is_absolute():
            root = Path(str(sweep_config.hydra.runtime.cwd)) / root
        by_root.setdefault(root, []).append(cfg)
    for root, cfgs in by_root.items():
        prepare_bases(cfgs, root, threads=cfgs[0].hardware.torch_threads or 1)


def _mark_dropped(ret: JobReturn, size: int) -> None:
    """A failed member's summary.json (written by the task function) says it was dropped from its population."""
    import json

    from hydra.core.utils import JobStatus

    from prorl_bench.run.outputs import SUMMARY, write_summary

    if ret.status != JobStatus.FAILED or ret.hydra_cfg is None:
        return
    path = Path(ret.hydra_cfg.hydra.runtime.output_dir) / SUMMARY
    if path.is_file():
        summary = json.loads(path.read_text())
        if summary.get("status") == "failed":
            summary["population"] = {"dropped": True, "size": size}
            write_summary(path.parent, summary)

"""A Hydra launcher that trains a multirun's jobs which differ only in seed as populations.

``prorl-bench -m seed=0,1,2,3 opt_reset=keep,hard hydra/launcher=population`` (or
``prorl-bench-sweep +sweep=NAME hydra/launcher=population``): jobs whose overrides are equal once
``seed=``/``warmup.seed=`` are removed form a group. The jobs are spread over W = min(
``hydra.launcher.n_jobs``, available CPUs) worker processes (loky, as the joblib launcher), each
getting at most ceil(jobs / W) — joblib's share, so no core idles that joblib would use; a
worker's part of a group is one population (of at most ``hydra.launcher.size``), a part of one job
and the jobs that cannot be batched (HF models, adapters, growth, dropout:
``runner.population_blockers`` names the key) run as single jobs, as under joblib. The plan is
logged, printed by ``hydra.launcher.dry_run=true`` and written to ``population_plan.json`` in the
sweep directory. Inside a population every
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
from typing import Any, NamedTuple

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict, read_write

log = logging.getLogger(__name__)

SEED_KEYS = ("seed", "warmup.seed")


PLAN_FILE = "population_plan.json"  # in the sweep directory: which worker ran which jobs, and why


class Unit(NamedTuple):
    """One population (``why`` is None) or one single job (``why`` says why it is not batched), run by
    worker task ``worker``. ``cfgs``: the members' validated configs (for the warm-up bases). A
    NamedTuple, not a dataclass: Hydra's plugin scan executes this module before it is in
    ``sys.modules``, where ``@dataclass`` with postponed annotations fails."""

    members: list[tuple[int, list[str]]]
    why: str | None
    worker: int
    cfgs: list[Any]


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

        from prorl_bench.run.threads import available_cpus

        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        jobs = [(initial_job_idx + i, list(o)) for i, o in enumerate(job_overrides)]
        cpus = available_cpus()
        workers = min(self.n_jobs, cpus, len(jobs))
        units = plan(self.hydra_context, self.config, jobs, self.size, workers)
        lines = [workers_line(len(jobs), workers, self.n_jobs, cpus), *describe(units)]
        for line in lines:
            log.info(line)
        if self.dry_run:
            print("\n".join(lines))
            raise SystemExit(0)
        _record_plan(sweep_dir, units, workers, self.n_jobs, cpus)
        state = Singleton.get_state()
        tasks = [[u for u in units if u.worker == w] for w in range(workers)]
        done = Parallel(n_jobs=workers, backend="loky")(
            delayed(run_units)(task, self.hydra_context, self.config, self.task_function, state)
            for task in tasks
            if task
        )
        by_idx = {idx: ret for unit in done for idx, ret in unit}
        return [by_idx[idx] for idx, _ in jobs]


def _group_key(overrides: Sequence[str]) -> tuple[str, ...]:
    return tuple(sorted(o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in SEED_KEYS))


def per_worker(n_jobs: int, workers: int) -> int:
    """Most jobs one worker runs: the joblib launcher's share, ceil(jobs / workers)."""
    return -(-n_jobs // workers)


def workers_line(n: int, workers: int, n_jobs: int, cpus: int) -> str:
    return (
        f"{n} jobs on {workers} worker processes (hydra.launcher.n_jobs={n_jobs}, {cpus} CPUs available): "
        f"at most {per_worker(n, workers)} jobs per worker, the share the joblib launcher gives each"
    )


def plan(
    hydra_context: HydraContext, config: DictConfig, jobs: list[tuple[int, list[str]]], size: int, workers: int = 1
) -> list[Unit]:
    """Populations of up to ``size`` jobs that differ only in seed, and solo jobs with the reason they
    cannot join one, spread over ``workers`` worker tasks.

    Each worker gets at most ceil(jobs / workers) jobs — the share the joblib launcher gives each of
    its processes — so a population never runs on fewer cores than the same jobs would under joblib:
    groups (largest first, then the solo jobs) are poured into the workers in turn, a worker's part of
    a group is one population (cut at ``size``), and a part of one job runs as a single job, as under
    joblib. Measured (docs/populations.md, issue 37): with ``size`` the only cap, 4 seeds on 2 workers
    were one population in one process while the other core idled."""
    from prorl_bench.config import to_config
    from prorl_bench.population.runner import member_differences, population_blockers

    groups: dict[tuple[str, ...], list[tuple[int, list[str], Any]]] = {}
    solo: list[tuple[list[tuple[int, list[str], Any]], str]] = []
    for idx, overrides in jobs:
        sweep_cfg = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        try:
            task = copy.deepcopy(sweep_cfg)
            with read_write(task), open_dict(task):
                del task["hydra"]
            cfg = to_config(task)
        except Exception as e:  # the job fails as a single job would, with its own error
            solo.append(([(idx, overrides, None)], f"config does not validate ({type(e).__name__})"))
            continue
        why = population_blockers(cfg)
        if sweep_cfg.hydra.job.get("chdir"):
            why.append("hydra.job.chdir=true: members share one process and its working directory")
        if why:
            solo.append(([(idx, overrides, cfg)], "; ".join(why)))
        else:
            groups.setdefault(_group_key(overrides), []).append((idx, overrides, cfg))
    pieces: list[tuple[list[tuple[int, list[str], Any]], str | None]] = []
    for members in sorted(groups.values(), key=len, reverse=True):
        # the overrides said "same but seed"; the composed configs must agree (interpolations, grids)
        first = members[0][2]
        same = [m for m in members if not member_differences(first, m[2])]
        pieces.append((same, None if len(same) > 1 else "alone in its group"))
        for m in members:
            if m not in same:
                solo.append(([m], "differs from its group in " + ", ".join(member_differences(first, m[2]))))
    return _pour([*pieces, *solo], size, per_worker(len(jobs), workers))


def _pour(pieces, size: int, room: int) -> list[Unit]:
    """Fill workers of ``room`` jobs each with the pieces in order; a piece split between workers
    becomes one population per worker (cut at ``size``; of one job: a single job)."""
    units: list[Unit] = []
    worker, left = 0, room
    for members, why in pieces:
        whole = len(members)
        while members:
            part, members = members[:left], members[left:]
            n_chunks = -(-len(part) // size)  # as few populations as the size allows, of near-equal sizes
            for k in range(n_chunks):
                chunk = part[k::n_chunks]
                reason = why
                if why is None and len(chunk) == 1:
                    reason = (
                        f"alone in its group at hydra.launcher.size={size}"
                        if len(part) > 1
                        else f"its group's other {whole - 1} jobs fill other workers (each its share, as under joblib)"
                    )
                units.append(Unit([(i, o) for i, o, _ in chunk], reason, worker, [c for _, _, c in chunk]))
            left -= len(part)
            if left == 0:
                worker, left = worker + 1, room
    return units


def describe(units: list[Unit]) -> list[str]:
    """One line per population or solo job (what the dry run prints)."""
    lines = []
    for u in units:
        jobs = " | ".join(f"#{i} {' '.join(filter_overrides(o))}" for i, o in u.members)
        if u.why is None:
            lines.append(f"population of {len(u.members)} (worker {u.worker}): {jobs}")
        else:
            lines.append(f"single job (worker {u.worker}; {u.why}): {jobs}")
    n_pop = sum(1 for u in units if u.why is None)
    lines.append(f"{n_pop} populations, {len(units) - n_pop} single jobs")
    return lines


def _record_plan(sweep_dir: Path, units: list[Unit], workers: int, n_jobs: int, cpus: int) -> None:
    """The plan beside the runs (``population_plan.json``): who ran with whom, in which worker, why."""
    import json

    record = {
        "workers": workers,
        "n_jobs": n_jobs,
        "cpus_available": cpus,
        "jobs_per_worker": per_worker(sum(len(u.members) for u in units), workers),
        "units": [
            {"worker": u.worker, "population": u.why is None, "jobs": [i for i, _ in u.members], "why": u.why}
            for u in units
        ],
    }
    (sweep_dir / PLAN_FILE).write_text(json.dumps(record, indent=1) + "\n")


def _job_config(hydra_context: HydraContext, config: DictConfig, idx: int, overrides: list[str]) -> DictConfig:
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    return sweep_config


def run_units(units: list[Unit], hydra_context, config, task_function, singleton_state) -> list[tuple[int, JobReturn]]:
    """In a worker process: its units one after the other (a population: lockstep member threads)."""
    from prorl_bench.run.signals import ignore_stop_signals_between_jobs

    # member threads cannot install signal handlers: SIGTERM/SIGINT to this worker are left to the
    # sweep's STOP file, which every member checks at its step end (checkpoint, then "preempted")
    ignore_stop_signals_between_jobs()
    setup_globals()
    Singleton.set_state(singleton_state)
    return [out for u in units for out in _run_unit(u, hydra_context, config, task_function)]


def _run_unit(unit: Unit, hydra_context, config, task_function) -> list[tuple[int, JobReturn]]:
    from prorl_bench.population.lockstep import Lockstep

    def job(idx: int, overrides: list[str]):
        def fn() -> JobReturn:
            sweep_config = _job_config(hydra_context, config, idx, overrides)
            HydraConfig.instance().set_config(sweep_config)
            return run_job(hydra_context=hydra_context, config=sweep_config, task_function=task_function,
                           job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")  # fmt: skip

        return fn

    if unit.why is not None:
        idx, overrides = unit.members[0]
        return [(idx, job(idx, overrides)())]
    _prepare_bases(config, unit.cfgs)
    results = Lockstep(len(unit.members)).run([job(i, o) for i, o in unit.members])
    out = []
    for (idx, _), ret in zip(unit.members, results):
        if isinstance(ret, BaseException):  # Hydra's run_job itself failed: report it as the job's failure
            err, ret = ret, JobReturn()
            from hydra.core.utils import JobStatus

            ret.status, ret.return_value = JobStatus.FAILED, err
        else:
            _mark_dropped(ret, len(unit.members))
        out.append((idx, ret))
    return out


def _prepare_bases(config: DictConfig, cfgs: list[Any]) -> None:
    """Warm-up bases built before the member threads start (``runner.prepare_bases`` says why), from
    the configs the plan validated (composing them again cost ~1 s a member on the loaded machine);
    the cache directory resolves as ``app.run`` resolves it (relative to the launch directory)."""
    from prorl_bench.population.runner import prepare_bases

    by_root: dict[Path, list] = {}
    for cfg in cfgs:
        root = Path(cfg.warmup.cache_dir)
        if not root.is_absolute():
            root = Path(str(config.hydra.runtime.cwd)) / root
        by_root.setdefault(root, []).append(cfg)
    for root, group in by_root.items():
        prepare_bases(group, root, threads=group[0].hardware.torch_threads or 1)


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

"""Reading a Hydra multirun directory: one ``RunRecord`` per job, failed and unfinished ones included.

A run directory is any folder under the sweep directory holding ``.hydra/overrides.yaml`` (Hydra
writes it before the job starts, so it exists for jobs that failed at once). Its status:

* ``completed`` / ``failed`` / ``preempted``: from ``summary.json`` (failed carries the error text;
  preempted runs stopped on SIGTERM/SIGINT with a checkpoint: ``prorl-bench-sweep --resume`` resumes them),
* ``incomplete``: no ``summary.json`` — killed, timed out or still running (steps logged so far kept),
* ``missing``: in the grid recorded in ``multirun.yaml`` but without a directory (never started).

Malformed content (a corrupt JSONL line other than a torn last one, an unreadable summary) raises
``SweepDirError`` naming the file, instead of silently dropping the run.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from prorl_bench.run.outputs import (
    EVENTS,
    FINISHED_CONFIG,
    FINISHED_SUMMARY,
    METRICS,
    RESOLVED_CONFIG,
    SUMMARY,
    VALIDATION,
    read_jsonl,
)

OVERRIDES = Path(".hydra") / "overrides.yaml"
MULTIRUN = "multirun.yaml"
SEED_KEY = "seed"
SUMMARY_STATUSES = ("completed", "failed", "preempted")  # what the trainer / app write into summary.json
# Overrides that never define a comparison group: the grid's own name and Hydra's settings.
NON_GROUP_PREFIXES = ("hydra.", "hydra/", "sweep", "run_dir", "progress")


class SweepDirError(ValueError):
    """The sweep directory is not a readable Hydra multirun; the message names the path."""


@dataclass
class RunRecord:
    """Everything one job left behind. ``overrides`` maps key (no +/~ prefix) to its value string."""

    run_dir: Path | None
    overrides: dict[str, str]
    status: str  # completed | failed | preempted | incomplete | missing
    error: str | None = None
    summary: dict[str, Any] | None = None
    metrics: pd.DataFrame = field(default_factory=pd.DataFrame)
    events: list[dict[str, Any]] = field(default_factory=list)
    validation: pd.DataFrame = field(default_factory=pd.DataFrame)
    config: dict[str, Any] = field(default_factory=dict)  # config_resolved.yaml, flattened ("algo.lr": 0.001)
    group: str = ""  # set by the aggregator when a label alone would pool runs whose settings differ

    @property
    def seed(self) -> str:
        return self.overrides.get(SEED_KEY, "0")


@dataclass
class Sweep:
    """All runs of a sweep, the keys that vary between them (seed excluded) and the fixed ones."""

    sweep_dir: Path
    runs: list[RunRecord]
    group_keys: list[str]
    fixed: dict[str, str]

    def group_of(self, run: RunRecord) -> tuple[str, ...]:
        return tuple(run.overrides.get(k, "") for k in self.group_keys)


def parse_override(line: str) -> tuple[str, str]:
    """``'+kl_estimator.placement=reward'`` -> ``('kl_estimator.placement', 'reward')``."""
    if "=" not in line:
        raise SweepDirError(f"override {line!r} has no '=' (deletions like ~key are not grid values)")
    key, value = line.split("=", 1)
    return key.lstrip("+~"), value.strip().strip("'\"")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        return read_jsonl(path)
    except (ValueError, UnicodeDecodeError) as e:  # read_jsonl names the file and line
        raise SweepDirError(f"{path}: malformed JSONL ({e}); only a torn last line is tolerated") from e


def _read_yaml_list(path: Path) -> list[str]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SweepDirError(f"{path}: not valid YAML ({e})") from e
    if data is None:
        return []
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        raise SweepDirError(f"{path}: expected a YAML list of 'key=value' strings, got {type(data).__name__}")
    return data


def find_run_dirs(sweep_dir: Path) -> list[Path]:
    """Every directory under ``sweep_dir`` holding ``.hydra/overrides.yaml`` (sorted)."""
    found = []
    for root, dirs, _files in os.walk(sweep_dir):
        here = Path(root)
        if (here / OVERRIDES).is_file() and here != sweep_dir:
            found.append(here)
            dirs[:] = []  # run directories do not nest
            continue
        dirs[:] = [d for d in dirs if d not in (".submitit", ".hydra", "aggregate")]
    if (sweep_dir / OVERRIDES).is_file():
        found.append(sweep_dir)  # a one-job sweep with an empty subdir
    return sorted(found)


def load_run(run_dir: Path) -> RunRecord:
    """Read one job's directory; status from summary.json, else ``incomplete``."""
    overrides = dict(parse_override(x) for x in _read_yaml_list(run_dir / OVERRIDES))
    metrics = pd.DataFrame(_read_jsonl(run_dir / METRICS))
    events = _read_jsonl(run_dir / EVENTS)
    validation = pd.DataFrame(_read_jsonl(run_dir / VALIDATION))
    summary = None
    if (run_dir / SUMMARY).is_file():
        try:
            summary = json.loads((run_dir / SUMMARY).read_text())
        except json.JSONDecodeError as e:
            raise SweepDirError(f"{run_dir / SUMMARY}: not valid JSON ({e})") from e
        if not isinstance(summary, dict) or summary.get("status") not in SUMMARY_STATUSES:
            raise SweepDirError(f"{run_dir / SUMMARY}: expected an object with status {'|'.join(SUMMARY_STATUSES)}")
    config_path = run_dir / RESOLVED_CONFIG
    if summary is not None and summary["status"] != "completed" and (run_dir / FINISHED_SUMMARY).is_file():
        # an extension of a finished run did not complete: report the finished segment (prorl_bench/run/record.py)
        summary, metrics, events, validation, config_path = _finished_segment(run_dir, summary, metrics, events,
                                                                              validation)  # fmt: skip
    if summary is not None:
        status, error = summary["status"], summary.get("error")
        n_done = summary.get("steps_completed")
        if status == "completed" and isinstance(n_done, int) and len(metrics) != n_done:
            # rows lost after the run finished: its curves would be silently short (re-run to repair)
            status = "incomplete"
            error = f"{METRICS} has {len(metrics)} rows but summary.json says {n_done} steps completed"
        if status == "preempted" and not error:
            error = f"preempted after {summary.get('steps_completed', len(metrics))} steps; re-run to resume"
    else:
        status = "incomplete"
        where = "during start-up/warm-up" if metrics.empty else f"after {len(metrics)} logged steps"
        error = f"no {SUMMARY}: stopped {where} (killed, timed out, or still running)"
        if not (run_dir / RESOLVED_CONFIG).is_file() and metrics.empty:
            error = f"no {SUMMARY} and no {RESOLVED_CONFIG}: the job died before the task function ran"
    config = _flat_config(config_path)
    return RunRecord(run_dir, overrides, status, error, summary, metrics, events, validation, config)


def _finished_segment(run_dir: Path, live: dict[str, Any], metrics: pd.DataFrame, events: list[dict[str, Any]],
                      validation: pd.DataFrame) -> tuple:  # fmt: skip
    """(summary, metrics, events, validation, config path) of the finished run an extension started from."""
    path = run_dir / FINISHED_SUMMARY
    try:
        finished = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SweepDirError(f"{path}: not valid JSON ({e})") from e
    n = finished.get("steps_completed") if isinstance(finished, dict) else None
    if finished.get("status") != "completed" or not isinstance(n, int):
        raise SweepDirError(f"{path}: expected a completed summary with steps_completed")
    finished = dict(finished, error=f"extension {live['status']} ({live.get('error') or 'no error recorded'}); "
                                    f"reporting the finished {n}-step run from {FINISHED_SUMMARY}")  # fmt: skip

    def upto(df: pd.DataFrame) -> pd.DataFrame:
        return df[df["step"] <= n].reset_index(drop=True) if "step" in df else df

    config = run_dir / FINISHED_CONFIG if (run_dir / FINISHED_CONFIG).is_file() else run_dir / RESOLVED_CONFIG
    return finished, upto(metrics), [e for e in events if e.get("step", 0) <= n], upto(validation), config


def _flat_config(path: Path) -> dict[str, Any]:
    """The resolved config as flat dotted keys (safe YAML loading); {} when the file is absent."""
    if not path.is_file():
        return {}
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise SweepDirError(f"{path}: not valid YAML ({e})") from e
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = json.dumps(node, sort_keys=True) if isinstance(node, list) else node

    walk(tree, "")
    return out


def expected_jobs(sweep_dir: Path) -> list[dict[str, str]] | None:
    """The grid ``multirun.yaml`` describes (basic sweeper only), as override dicts; None if unknown."""
    path = sweep_dir / MULTIRUN
    if not path.is_file():
        return None
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    cfg = yaml.safe_load(path.read_text()) or {}
    hydra_cfg = cfg.get("hydra", {})
    sweeper = hydra_cfg.get("sweeper", {})
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    try:  # multirun.yaml is saved unresolved: a study's seed block is ${study.blocks.${study.block}}
        from omegaconf import OmegaConf

        resolved = OmegaConf.to_container(OmegaConf.create(cfg).hydra.sweeper.params, resolve=True) or {}
    except Exception:  # an interpolation this reader cannot resolve: skip the missing-job check
        return None
    params = [f"{k}={v}" for k, v in resolved.items()]
    task = list(hydra_cfg.get("overrides", {}).get("task", []))
    try:
        parsed = OverridesParser.create().parse_overrides(params + task)
        jobs = BasicSweeper.split_arguments(parsed, None)[0]
    except Exception:  # a grid syntax this reader does not know: skip the missing-job check
        return None
    return [dict(parse_override(x) for x in job) for job in jobs]


# Hydra overrides a resumed sweep must not replay: it pins the directory itself; -m sets the mode
NOT_REPLAYED = ("hydra.sweep.dir=", "hydra.mode=")


def _recorded_hydra(sweep_dir: Path) -> dict[str, Any]:
    """The ``hydra`` node of the multirun's ``multirun.yaml`` (as Hydra saved it at launch, unresolved)."""
    path = sweep_dir / MULTIRUN
    if not path.is_file():
        raise SweepDirError(f"{path} not found: {sweep_dir} is not a Hydra multirun directory (or it never started)")
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise SweepDirError(f"{path}: not valid YAML ({e})") from e
    return cfg.get("hydra") or {}


def recorded_figures(sweep_dir: str | Path) -> bool:
    """Whether the multirun in ``sweep_dir`` draws figures: its ``hydra.callbacks.aggregate.figures`` as
    Hydra parsed it from the command line (True when the callback or the key is not recorded)."""
    node = ((_recorded_hydra(Path(sweep_dir)).get("callbacks") or {}).get("aggregate")) or {}
    return bool(node.get("figures", True))


def recorded_command(sweep_dir: str | Path) -> tuple[list[str], Path | None]:
    """The overrides that launched the multirun in ``sweep_dir`` (from its ``multirun.yaml``: the
    command line's task and Hydra overrides) with ``hydra.sweep.dir`` pinned to ``sweep_dir``, and
    the directory it was launched from (relative paths in the overrides are relative to it; None
    when not recorded). Re-launching these runs the same jobs in the same run directories."""
    sweep_dir = Path(sweep_dir).resolve()
    path = sweep_dir / MULTIRUN
    hydra_cfg = _recorded_hydra(sweep_dir)
    overrides = hydra_cfg.get("overrides") or {}
    task, hydra_ovr = list(overrides.get("task") or []), list(overrides.get("hydra") or [])
    if not all(isinstance(x, str) for x in task + hydra_ovr):
        raise SweepDirError(f"{path}: hydra.overrides.task / .hydra must be lists of 'key=value' strings")
    kept = [o for o in hydra_ovr if not o.startswith(NOT_REPLAYED)]
    cwd = (hydra_cfg.get("runtime") or {}).get("cwd")
    return [*task, *kept, f"hydra.sweep.dir={_quoted(str(sweep_dir))}"], Path(cwd) if cwd else None


def _quoted(value: str) -> str:
    """A value for Hydra's override grammar: plain when it is a plain path, else single-quoted
    (a ',' would make it a sweep, '=' or a space a syntax error)."""
    if re.fullmatch(r"[\w./-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _group_keys(runs: list[RunRecord]) -> tuple[list[str], dict[str, str]]:
    keys: list[str] = []
    for r in runs:
        keys.extend(k for k in r.overrides if k not in keys)
    varied, fixed = [], {}
    for k in keys:
        values = {r.overrides.get(k) for r in runs}
        if k == SEED_KEY or k.startswith(NON_GROUP_PREFIXES):
            if len(values) == 1:
                fixed[k] = next(iter(values)) or ""
            continue
        if len(values) > 1:
            varied.append(k)
        else:
            fixed[k] = next(iter(values)) or ""
    return varied, fixed


def load_sweep(sweep_dir: str | Path) -> Sweep:
    """Load every run of a multirun directory (plus grid jobs that never started, as ``missing``)."""
    sweep_dir = Path(sweep_dir).resolve()
    if not sweep_dir.is_dir():
        raise SweepDirError(f"sweep directory {sweep_dir} does not exist")
    runs = [load_run(d) for d in find_run_dirs(sweep_dir)]
    expected = expected_jobs(sweep_dir)
    if expected is not None:
        have = [r.overrides for r in runs]
        for job in expected:
            if job not in have:
                runs.append(RunRecord(None, job, "missing", "in the grid of multirun.yaml but no run directory"))
    if not runs:
        raise SweepDirError(
            f"{sweep_dir}: no run directories (folders with {OVERRIDES}) and no {MULTIRUN}; "
            "pass the directory of a Hydra multirun (e.g. outputs/sweeps/ablation/<date>)"
        )
    group_keys, fixed = _group_keys(runs)
    return Sweep(sweep_dir, runs, group_keys, fixed)


def group_label(sweep: Sweep, run: RunRecord) -> str:
    """Readable group name: ``A0`` for one varied key, ``placement=reward, beta=0.01`` for several
    (plus the differing settings when runs with one label did not share their settings)."""
    if run.group:
        return run.group
    if not sweep.group_keys:
        return "all"
    values = sweep.group_of(run)
    if len(values) == 1:
        return values[0]
    return ", ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(sweep.group_keys, values))


# What determines the base policy and the prompt stream besides the seed: runs of two groups are
# paired by seed only when these agree (then they start from one base and see the same prompts).
PAIRING_PREFIXES = ("task.", "model.", "warmup.")
PAIRING_KEYS = ("algo.prompts_per_step", "algo.group_size", "algo.temperature")


def pair_key(run: RunRecord, base_per_seed: bool = False) -> tuple[str, str]:
    """(seed, everything that fixes the base and the prompt stream): equal keys pair. ``base_per_seed``:
    every run of the sweep trains its base with its own seed ('warmup.seed=${seed}'), so the warm-up seed
    goes with the seed (which the key holds already) and is no setting of its own."""
    cfg = run.config
    shared = {k: v for k, v in cfg.items() if k.startswith(PAIRING_PREFIXES) or k in PAIRING_KEYS}
    shared.pop("warmup.cache_dir", None)
    if base_per_seed:
        shared.pop("warmup.seed", None)
    if not any(k.startswith("task.") for k in shared):
        # No resolved task settings (config_resolved.yaml absent or foreign): that the runs share a
        # base and a prompt stream cannot be checked, so this run pairs with nothing (Welch).
        return run.seed, f"unverifiable:{run.run_dir}"
    return run.seed, repr(sorted(shared.items()))


def base_per_seed(runs: list[RunRecord]) -> bool:
    """Whether every run with a config trained its base with its own seed ('warmup.seed=${seed}'): then the
    warm-up seed varies exactly as the seed does and neither splits groups nor stops pairing. A fixed
    warm-up seed (the default) is not: seed 0 with base 0 beside seed 1 with base 0 are ordinary runs."""
    configured = [r for r in runs if r.config]
    return bool(configured) and all(r.config.get("warmup.seed") == r.config.get("seed") for r in configured)

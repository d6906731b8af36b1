"""Runs into groups: the runs table (one row per run, every status), seed blocks, groups split when
their settings differ, several sweep directories read together, the per-group table (mean ± 95% CI
over completed seeds), the study the runs declare and the baseline group the others are compared with.

Groups are the combinations of the overrides that vary across the sweep, seed excluded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from prorl_bench.config.metric_catalog import DEFAULT_THRESHOLD, DEFAULT_WINDOW, METRIC_NAMES
from prorl_bench.config.study import REQUIRED_BLOCKS, StudyConfig, study_from_dict
from prorl_bench.registry import ConfigError
from prorl_bench.sweeps import stats
from prorl_bench.sweeps.run_figures import run_metrics
from prorl_bench.sweeps.sweepdir import (
    RunRecord,
    Sweep,
    SweepDirError,
    base_per_seed,
    group_label,
    load_sweep,
)

STATUSES = ("completed", "failed", "preempted", "incomplete", "missing")
NO_BLOCK = ""  # runs of a grid that declares no study


def first_line(text: str | None, limit: int = 160) -> str:
    if not text:
        return ""
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def run_table(sweep: Sweep, threshold: float = DEFAULT_THRESHOLD, window: int = DEFAULT_WINDOW) -> pd.DataFrame:
    """One row per run (missing and failed included): group keys, seed, seed block, source sweep
    (1-based, as the heading lists the directories), status, error, figures."""
    rows = []
    origin = sweep.origin if isinstance(sweep, Sweeps) else {}
    for run in sweep.runs:
        row: dict[str, Any] = {"group": group_label(sweep, run)}
        row.update({k: run.overrides.get(k, "") for k in sweep.group_keys})
        row["seed"] = run.seed
        row["block"] = run_block(run)
        row["sweep"] = origin.get(id(run), 0) + 1
        row["status"] = run.status
        row["error"] = first_line(run.error, limit=10_000)
        row.update(run_metrics(run, threshold, window))
        row["run_dir"] = str(run.run_dir) if run.run_dir else ""
        rows.append(row)
    df = pd.DataFrame(rows)
    df = _fill_blocks(df)
    order = {s: i for i, s in enumerate(STATUSES)}
    df["_o"] = df["status"].map(order)
    df["_b"] = df["block"].map(block_rank)
    df["_s"] = pd.to_numeric(df["seed"], errors="coerce")  # 2 before 10 (seeds may come as text)
    df = df.sort_values(["_b", "group", "_o", "_s", "seed"], kind="stable").drop(columns=["_o", "_b", "_s"])
    return df.reset_index(drop=True)


def block_rank(block: str) -> tuple[int, str]:
    return (REQUIRED_BLOCKS.index(block) if block in REQUIRED_BLOCKS else len(REQUIRED_BLOCKS), block)


def _fill_blocks(df: pd.DataFrame) -> pd.DataFrame:
    """Runs that never wrote a config (missing, died at start-up) take their sweep's block."""
    for _, g in df.groupby("sweep"):
        known = [b for b in g["block"] if b != NO_BLOCK]
        if known and len(set(known)) == 1:
            df.loc[g.index, "block"] = known[0]
    return df


# Settings that never make two runs different experiments (where files go, threads, logging; the study
# node: which seed block a run belongs to is handled as the block, not as a setting).
RUN_SPECIFIC = ("seed", "run_dir", "progress", "warmup.cache_dir", "hardware.torch_threads", "eval.batch")
RUN_SPECIFIC_PREFIXES = ("tracking.", "checkpoint.", "study.")


@dataclass
class Sweeps(Sweep):
    """One or several sweep directories read together. ``dirs``: every directory, in the order given;
    ``origin``: id(run) -> index into ``dirs``; ``label``: id(run) -> its group label *within its own
    sweep* (so a key that only another sweep varies never shows up empty in a label)."""

    dirs: list[Path] = field(default_factory=list)
    origin: dict[int, int] = field(default_factory=dict)
    label: dict[int, str] = field(default_factory=dict)

    def sources(self, runs: Sequence[RunRecord]) -> str:
        """``[1]``, ``[1+2]``: which directories these runs come from (1-based, as the heading lists them)."""
        return "[" + "+".join(str(i + 1) for i in sorted({self.origin[id(r)] for r in runs})) + "]"


def _settings(run: RunRecord) -> dict[str, Any]:
    return {k: v for k, v in run.config.items() if k not in RUN_SPECIFIC and not k.startswith(RUN_SPECIFIC_PREFIXES)}


def split_inconsistent_groups(sweep: Sweep) -> list[str]:
    """Label every run by its own sweep's varied overrides, and never pool runs whose settings differ:
    within one label, runs with different resolved settings (e.g. 100 vs 150 steps from two sweeps)
    become separate groups named by the differing keys. Returns one note per split label."""
    notes = []
    by_label: dict[str, list[RunRecord]] = {}
    per_seed = base_per_seed(sweep.runs)
    own = sweep.label if isinstance(sweep, Sweeps) else {}
    for run in sweep.runs:
        run.group = own.get(id(run), "")
        by_label.setdefault(group_label(sweep, run), []).append(run)
    for label, members in by_label.items():
        configured = [r for r in members if r.config]
        keys = sorted({k for r in configured for k in _settings(r)})
        # a base per seed ('warmup.seed=${seed}') varies as the seed does: one group per arm, not per base
        keys = [k for k in keys if not (per_seed and k == "warmup.seed")]
        differing = [k for k in keys if len({repr(_settings(r).get(k)) for r in configured}) > 1]
        for r in members:
            r.group = label
            if differing and r.config:
                r.group = f"{label} [{', '.join(f'{k}={_settings(r).get(k)}' for k in differing[:3])}]"
        if differing:
            notes.append(f"group {label!r} split: its runs differ in {', '.join(differing)}")
    return notes


def default_baseline(groups: Sequence[str]) -> str | None:
    """A1 (the reference-model baseline) when present, else keep (the optimizer-state baseline),
    else the first group."""
    for name in ("A1", "keep"):
        if name in groups:
            return name
    return groups[0] if groups else None


def run_block(run: RunRecord) -> str:
    """The seed block a run belongs to (``study.block`` of its resolved config or its overrides)."""
    if run.config.get("study.question"):
        return str(run.config.get("study.block", "explore"))
    return run.overrides.get("study.block", NO_BLOCK)


def _study_node(run: RunRecord) -> dict[str, Any] | None:
    """The run's ``study:`` node rebuilt from its flattened resolved config (None: no study)."""
    flat = {k[len("study.") :]: v for k, v in run.config.items() if k.startswith("study.")}
    if not flat.get("question"):
        return None
    node: dict[str, Any] = {"blocks": {}}
    for key, value in flat.items():
        if key.startswith("blocks."):
            node["blocks"][key.split(".", 1)[1]] = str(value)
        elif key == "primary":
            node[key] = json.loads(value) if isinstance(value, str) else value
        else:
            node[key] = value
    return node


def read_study(sweep: Sweep) -> tuple[StudyConfig | None, list[str]]:
    """The study the runs declare (one for all of them, blocks aside), or None with a note saying why.

    Blocks aside: a block may be extended after its first sweep (more seeds, as the seed plan asks), so
    runs may record different ``blocks`` extents. They are one study when everything else is equal, no
    seed ran in two blocks, and one of the recorded declarations holds every run's seed in that run's
    block; that declaration (the widest) is the study's, and a note says the blocks were extended."""
    nodes, extents = {}, {}
    ran: dict[int, set[str]] = {}  # seed -> the blocks it ran in
    for run in sweep.runs:
        node = _study_node(run)
        if node is not None:
            extents.setdefault(json.dumps(node["blocks"], sort_keys=True), run)
            if run.config.get("seed") is not None:
                ran.setdefault(int(run.config["seed"]), set()).add(run_block(run))
            node = {k: v for k, v in node.items() if k not in ("block", "blocks")}
            nodes.setdefault(json.dumps(node, sort_keys=True), run)
    if not nodes:
        return None, []
    if len(nodes) > 1 or any(r.config and _study_node(r) is None for r in sweep.runs):
        return None, ["the runs do not declare one study (different `study:` nodes, or runs without one): "
                      "every comparison is descriptive"]  # fmt: skip
    text, run = next(iter(nodes.items()))
    try:
        declared = [study_from_dict({**json.loads(text), "blocks": json.loads(b), "block": run_block(run)})
                    for b in extents]  # fmt: skip
    except ConfigError as e:
        raise SweepDirError(f"{run.run_dir}: config_resolved.yaml: {e}") from e
    if len(declared) == 1:
        return declared[0], []
    return _extended_study(ran, declared)


def _extended_study(ran: dict[int, set[str]], declared: list[StudyConfig]) -> tuple[StudyConfig | None, list[str]]:
    """The declaration that holds every run's seed in its own block (``ran``: seed -> its blocks), when no
    seed ran in two blocks."""
    twice = sorted(s for s, blocks in ran.items() if len(blocks) > 1)
    fits = [d for d in declared if all(b in d.blocks and s in d.seeds(b) for s, blocks in ran.items() for b in blocks)]
    if twice or not fits:
        why = f"seeds {twice} ran in two blocks" if twice else "no recorded declaration holds every run's seed"
        return None, [f"the runs declare different seed blocks and {why}: every comparison is descriptive"]
    study = max(fits, key=lambda d: sum(len(d.seeds(b)) for b in d.blocks))
    extents = "; ".join(f"{b}: {study.blocks[b]}" for b in study.blocks)
    return study, [f"the runs record different seed blocks (a block was extended); the study's are {extents}, "
                   "which hold every run's seed in its own block"]  # fmt: skip


def group_table(runs: pd.DataFrame, group_keys: Sequence[str]) -> pd.DataFrame:
    """Per (seed block, group): run counts by status and, over completed runs, mean / 95% CI
    half-width / n per figure; ``sweeps``: which directories its runs come from (``1``, ``1+2``)."""
    out = []
    blocks = runs["block"] if "block" in runs else pd.Series(NO_BLOCK, index=runs.index)
    for (block, group), g in runs.groupby([blocks, "group"], sort=False):
        row: dict[str, Any] = {"group": group}
        row.update({k: g[k].iloc[0] for k in group_keys})
        row["block"] = block
        row["sweeps"] = "+".join(str(i) for i in sorted(set(g["sweep"]))) if "sweep" in g else "1"
        row["n_runs"] = len(g)
        for s in STATUSES:
            row[f"n_{s}"] = int((g["status"] == s).sum())
        ok = g[g["status"] == "completed"]
        for m in METRIC_NAMES:
            mean, ci, n = stats.mean_ci(list(ok[m]) if m in ok else [])
            row[f"{m}_mean"], row[f"{m}_ci95"], row[f"{m}_n"] = mean, ci, n
        out.append(row)
    return pd.DataFrame(out)


def load_sweeps(sweep_dirs: Sequence[str | Path]) -> Sweeps:
    """One sweep, or several read together. Each run keeps the label its own sweep gives it (so a key
    only another sweep varies never appears empty in a label); the group keys are the union of every
    sweep's varied keys; a key is fixed when every sweep fixes it to the same value. Runs whose
    settings differ under one label are split later (``split_inconsistent_groups``), never pooled."""
    sweeps = [load_sweep(d) for d in sweep_dirs]
    runs = [r for sw in sweeps for r in sw.runs]
    keys = list(dict.fromkeys(k for sw in sweeps for k in sw.group_keys))
    fixed = {
        k: v for k, v in sweeps[0].fixed.items() if k not in keys and all(sw.fixed.get(k) == v for sw in sweeps[1:])
    }
    origin = {id(r): i for i, sw in enumerate(sweeps) for r in sw.runs}
    label = {id(r): group_label(sw, r) for sw in sweeps for r in sw.runs} if len(sweeps) > 1 else {}
    return Sweeps(sweeps[0].sweep_dir, runs, keys, fixed, [sw.sweep_dir for sw in sweeps], origin, label)


def find_group(label: str, sweep: Sweep, names: Sequence[str]) -> str | None:
    """The group a baseline label names, also when the grid was narrowed on the command line: the
    study's ``factor=1.0, step=keep`` is the group ``1.0`` of a sweep run with ``opt_reset.step=keep``
    (every ``key=value`` of the label must hold for the group's runs; keys as labels shorten them)."""
    if label in names:
        return label
    if "=" not in label:
        return None
    pairs = dict(part.split("=", 1) for part in label.split(", ") if "=" in part)
    for name in names:
        members = [r for r in sweep.runs if group_label(sweep, r) == name]
        short = [{k.split(".")[-1]: v for k, v in r.overrides.items()} for r in members]
        if members and all(all(o.get(k) == v for k, v in pairs.items()) for o in short):
            return name
    return None


def choose_baseline(
    sweep: Sweeps, names: Sequence[str], requested: str | None, strict: bool, study: StudyConfig | None
) -> tuple[str | None, StudyConfig | None, list[str]]:
    """(baseline group, the study if its primary family still applies, notes).

    Order: ``--baseline`` (or the grid's callback setting), else the study's declared baseline, else
    A1 / keep, else the first group. A baseline other than the study's makes every cell descriptive.
    With several directories the fallback "first group" is refused (it would be an arbitrary pick
    from one of them): name the baseline with ``--baseline``."""
    notes: list[str] = []
    if requested is not None and requested not in names:
        if strict:
            raise SweepDirError(f"--baseline {requested!r} is not a group of this sweep; groups: {list(names)}")
        notes.append(f"baseline {requested!r} (from the grid's config) is not a group here; using the default")
        requested = None
    if study is not None:
        if requested is not None and requested != find_group(study.baseline, sweep, names):
            notes.append(
                f"baseline {requested!r} is not the study's declared `{study.baseline}`: every cell is descriptive"
            )
            study = None
        elif (found := find_group(study.baseline, sweep, names)) is None:
            notes.append(f"the study's baseline `{study.baseline}` is not a group here: every cell is descriptive")
            study = None
        else:
            if found != study.baseline:
                notes.append(f"the study's baseline `{study.baseline}` is the group `{found}` here")
            requested = found
    if requested is not None:
        return requested, study, notes
    chosen = default_baseline(names)
    if len(sweep.dirs) > 1 and len(names) > 1 and chosen not in ("A1", "keep"):
        raise SweepDirError(
            f"{len(sweep.dirs)} sweeps and no group named A1 or keep: pass --baseline GROUP (groups: {list(names)})"
        )
    return chosen, study, notes

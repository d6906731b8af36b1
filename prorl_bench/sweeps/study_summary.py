"""A study's compact summary: what `docs/results.md` is generated from (``prorl-bench-report --summary``).

One JSON file per study stratum holds, per seed block, every run's group, seed, status and the values
of the study's primary endpoints and a few descriptive columns, and the block's provenance (the sweep
command, commits, machine, dates, wall time). It is small enough to commit (kilobytes), and it holds
everything the verdict table needs: the paired statistics are recomputed from the per-seed values by
the aggregator's own functions (``comparisons_from_summary``), so the documentation shows numbers a
command made, never numbers someone typed. Dates, machines and commits live here, not in prose.

Schema (``SCHEMA``)::

    {"schema": "prorl-bench/study-summary/1", "study": NAME, "stratum": "algo.lr=1e-3 model=small",
     "question": str, "baseline": GROUP, "primary": [{"metric", "direction", "margin"}],
     "blocks": {BLOCK: {"seeds": [int], "paired": {GROUP: bool},
                        "provenance": {"command", "commits", "dirty", "machine", "torch", "started",
                                       "finished", "wall_s", "run_s"},
                        "runs": [{"group", "seed", "status", "values": {METRIC: float | null}}]}}}
"""

from __future__ import annotations

import json
import math
import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from prorl_bench.config.study import Direction, Endpoint, StudyConfig
from prorl_bench.sweeps import stats
from prorl_bench.sweeps.compare import adjust_and_judge
from prorl_bench.sweeps.grouping import block_rank

SCHEMA = "prorl-bench/study-summary/1"
# Descriptive columns kept beside the primary endpoints (those a run has; runs.csv names them).
DESCRIPTIVE = (
    "val_pass1_final",
    "val_passk_final",
    "val_pass1_auc",
    "val_pass1_base",
    "success_final",
    "kl_mean",
    "n_resets",
    "ref_tokens_per_step",
    "time_per_step_ms",
    "ref_share_pct",
    "curve_plateaued",
    "curve_steps_to_plateau",
    "curve_collapse_events",
)
# Overrides that say how or where a sweep ran, not what it studies: left out of the stratum's name.
_NOT_STRATUM = ("+sweep=", "sweep=", "study.block=", "hydra.", "warmup.cache_dir=", "+study.blocks.")


class SummaryError(ValueError):
    """A summary file that is not a study summary (wrong schema, missing keys, non-finite numbers)."""


def _finite_or_none(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _stamp(sweep_dir: Path) -> datetime | None:
    """The start time Hydra wrote into the sweep directory's name (``%Y-%m-%d_%H-%M-%S``), as UTC."""
    try:
        return datetime.strptime(sweep_dir.name, "%Y-%m-%d_%H-%M-%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def _block_provenance(res: Any, block_runs: pd.DataFrame) -> dict[str, Any]:
    """Command, commits, machine and times of one block, from its runs' ``summary.json`` provenance."""
    by_dir = {str(r.run_dir): r for r in res.sweep.runs if r.run_dir}
    records = [by_dir[d] for d in block_runs["run_dir"] if d in by_dir]
    provs = [(r.summary or {}).get("provenance") or {} for r in records]
    bench = [p.get("bench") or {} for p in provs]
    machine = next((p.get("machine") for p in provs if p.get("machine")), {}) or {}
    command = next((p.get("command") for p in provs if p.get("command")), None)
    summaries = [r.run_dir / "summary.json" for r in records if (r.run_dir / "summary.json").exists()]
    starts = [s for s in (_stamp(r.run_dir.parent) for r in records) if s is not None]
    finished = max((datetime.fromtimestamp(p.stat().st_mtime, timezone.utc) for p in summaries), default=None)
    started = min(starts, default=None)
    run_s = sum(_finite_or_none((r.summary or {}).get("wall_time_s")) or 0.0 for r in records)
    return {
        "command": shlex.join(command) if command else "",
        "commits": sorted({b.get("commit") or "unknown" for b in bench}),
        "dirty": any(bool(b.get("dirty")) for b in bench),
        "machine": f"{machine.get('cpu_model', '?')}, {machine.get('cpu_count', '?')} CPUs"
        + (f", GPU {machine['gpu']}" if machine.get("gpu") else ""),
        "torch": next((p.get("packages", {}).get("torch") for p in provs if p.get("packages")), ""),
        "started": started.strftime("%Y-%m-%d %H:%M UTC") if started else "",
        "finished": finished.strftime("%Y-%m-%d %H:%M UTC") if finished else "",
        "wall_s": round((finished - started).total_seconds()) if started and finished else None,
        "run_s": round(run_s),
    }


def stratum_of(command: str) -> str:
    """The overrides of a sweep command that fix its operating point (``algo.lr=1e-3 model=small``)."""
    words = shlex.split(command)[1:] if command else []
    return " ".join(w for w in words if not w.startswith(_NOT_STRATUM) and "," not in w)


def build_summary(res: Any, name: str | None = None, stratum: str | None = None) -> dict[str, Any]:
    """The compact summary of an aggregated study (``aggregate.AggregateResult`` with a declared study).

    ``name`` and ``stratum`` label it (default: the ``+sweep=`` of its command and that command's
    operating-point overrides)."""
    if res.study is None:
        raise SummaryError("these runs declare no study: a summary needs the study's question and endpoints")
    study: StudyConfig = res.study
    metrics = [e.metric for e in study.primary] + [m for m in DESCRIPTIVE if m in res.runs]
    metrics = list(dict.fromkeys(metrics))
    blocks: dict[str, Any] = {}
    for block in sorted(dict.fromkeys(res.runs["block"]), key=block_rank):
        rows = res.runs[res.runs["block"] == block]
        comp = res.comparisons
        comp = comp[comp["block"] == block] if not comp.empty else comp
        paired = {str(g): bool(p) for g, p in zip(comp.get("group", []), comp.get("paired", []))}
        runs = [
            {
                "group": str(r["group"]),
                "seed": int(r["seed"]),
                "status": str(r["status"]),
                "values": {m: _finite_or_none(r.get(m)) for m in metrics},
            }
            for _, r in rows.iterrows()
        ]
        blocks[str(block)] = {
            "seeds": sorted({int(s) for s in rows["seed"]}),
            "paired": paired,
            "provenance": _block_provenance(res, rows),
            "runs": runs,
        }
    command = next((b["provenance"]["command"] for b in blocks.values() if b["provenance"]["command"]), "")
    return {
        "schema": SCHEMA,
        "study": name or _study_name(command),
        "stratum": stratum if stratum is not None else stratum_of(command),
        "question": study.question,
        "baseline": study.baseline,
        "primary": [{"metric": e.metric, "direction": e.direction.value, "margin": e.margin} for e in study.primary],
        "blocks": blocks,
    }


def _study_name(command: str) -> str:
    for w in shlex.split(command) if command else []:
        if w.startswith(("+sweep=", "sweep=")):
            return w.split("=", 1)[1]
    return "study"


def write_summary(summary: dict[str, Any], path: Path) -> Path:
    """Write ``summary`` as sorted, indented JSON (diffs stay readable); refuses non-finite numbers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1, sort_keys=True, allow_nan=False) + "\n")
    return path


def load_summary(path: Path) -> dict[str, Any]:
    """Read and check one summary file; a wrong schema or missing key is a ``SummaryError`` naming it."""
    try:
        data = json.loads(Path(path).read_text(), parse_constant=_refuse_constant)
    except (OSError, ValueError) as e:
        raise SummaryError(f"{path}: not a readable study summary ({e})") from e
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise SummaryError(f"{path}: schema is {data.get('schema') if isinstance(data, dict) else None!r}, "
                           f"expected {SCHEMA!r}")  # fmt: skip
    for key in ("study", "stratum", "question", "baseline", "primary", "blocks"):
        if key not in data:
            raise SummaryError(f"{path}: missing key {key!r}")
    for block, b in data["blocks"].items():
        for key in ("seeds", "paired", "provenance", "runs"):
            if key not in b:
                raise SummaryError(f"{path}: block {block!r} misses key {key!r}")
    return data


def _refuse_constant(name: str) -> None:
    raise ValueError(f"non-finite number {name} (a summary holds finite values or null)")


def comparisons_from_summary(summary: dict[str, Any]) -> pd.DataFrame:
    """The primary cells of the aggregator's comparison table, recomputed from the per-seed values:
    per block, each non-baseline group's paired (or Welch) difference to the baseline per primary
    endpoint, Holm over the block's primary cells, TOST against the margin, the verdict."""
    primary = {e["metric"]: Endpoint(e["metric"], Direction(e["direction"]), e["margin"]) for e in summary["primary"]}
    base_name = summary["baseline"]
    out = []
    for block, b in sorted(summary["blocks"].items(), key=lambda kv: block_rank(kv[0])):
        ok = [r for r in b["runs"] if r["status"] == "completed"]
        base = {r["seed"]: r["values"] for r in ok if r["group"] == base_name}
        groups = list(dict.fromkeys(r["group"] for r in ok if r["group"] != base_name))
        rows = []
        for group in groups:
            mine = {r["seed"]: r["values"] for r in ok if r["group"] == group}
            shared = [s for s in mine if s in base]
            for metric, e in primary.items():
                if b["paired"].get(group, True):
                    margin = e.margin if e.margin is not None else stats.NAN
                    vals = [mine[s].get(metric) for s in shared], [base[s].get(metric) for s in shared]
                    c = stats.paired_comparison(*vals, margin=margin)
                else:
                    c = stats.welch_comparison([v.get(metric) for v in mine.values()],
                                               [v.get(metric) for v in base.values()])  # fmt: skip
                rows.append({"block": block, "group": group, "metric": metric, **c.__dict__, "family": "primary"})
        table = pd.DataFrame(rows)
        if not table.empty:
            adjust_and_judge(table, primary)
            out.append(table)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()

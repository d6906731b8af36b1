"""Before comparing runs: do they come from the same code, packages and machine? (pure functions)

Each run's provenance is the ``provenance`` object of its ``summary.json`` (prorl_bench/run/provenance.py).
``provenance_warnings`` names every field that changes numbers and takes more than one value among the
runs being compared (another torch, another CPU model, another commit, a different diff on a dirty
tree), and says when runs were made from a modified tree or record no provenance at all.
``provenance_rows`` is the per-group table the aggregator prints (and the HTML report shows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# (label, path in the provenance object): fields whose change can change a run's numbers
NUMERIC_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("bench commit", ("bench", "commit")),
    ("bench diff (dirty tree)", ("bench", "diff_sha256")),
    ("torch", ("packages", "torch")),
    ("numpy", ("packages", "numpy")),
    ("transformers", ("packages", "transformers")),
    ("trl", ("packages", "trl")),
    ("peft", ("packages", "peft")),
    ("torch BLAS", ("torch", "blas")),
    ("torch threads", ("torch", "num_threads")),
    ("CPU model", ("machine", "cpu_model")),
    ("GPU", ("machine", "gpu", "name")),
    ("GPU driver", ("machine", "gpu", "driver")),
)
# shown per group but not warned about: they do not change the numbers
SHOWN_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("bench", ("bench", "version")),
    ("hydra-core", ("packages", "hydra-core")),
    ("omegaconf", ("packages", "omegaconf")),
    ("host", ("machine", "hostname")),
)


def field(prov: Mapping[str, Any], path: Sequence[str]) -> Any:
    """The value at ``path`` (None where any level is missing or null)."""
    node: Any = prov
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _fmt(value: Any) -> str:
    if value is None:
        return "none"
    text = str(value)
    return text[:12] if len(text) == 40 and all(c in "0123456789abcdef" for c in text) else text


def _short_hash(value: Any) -> str:
    return "none" if value is None else str(value)[:12]


def provenance_warnings(runs: Sequence[tuple[str, Mapping[str, Any] | None]]) -> list[str]:
    """Warnings for ``runs`` ([(run label, provenance or None)]), one per differing field, naming the
    values and the runs that hold each (at most three names per value)."""
    known = [(name, p) for name, p in runs if p]
    out: list[str] = []
    missing = [name for name, p in runs if not p]
    if missing and known:
        out.append(f"{len(missing)} of {len(runs)} runs record no provenance (made before it was recorded, or died "
                   f"before writing summary.json): {_names(missing)}")  # fmt: skip
    for label, path in NUMERIC_FIELDS:
        by_value: dict[str, list[str]] = {}
        for name, p in known:
            fmt = _short_hash if path[-1] == "diff_sha256" else _fmt
            by_value.setdefault(fmt(field(p, path)), []).append(name)
        if len(by_value) > 1:
            values = "; ".join(f"{v} ({_names(names)})" for v, names in by_value.items())
            out.append(f"runs differ in {label}, which can change their numbers: {values}")
    dirty = [name for name, p in known if field(p, ("bench", "dirty"))]
    if dirty:
        out.append(f"{len(dirty)} of {len(known)} runs were made from a modified tree (bench.dirty): its commit alone "
                   f"does not reproduce them: {_names(dirty)}")  # fmt: skip
    return out


def _names(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


Groups = Sequence[tuple[str, Sequence[Mapping[str, Any] | None]]]


def provenance_rows(groups: Groups) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per group, every value each field takes among its runs ("a / b" when several)."""
    fields = [
        ("commit", ("bench", "commit")),
        ("dirty", ("bench", "dirty")),
        *[(lab, p) for lab, p in NUMERIC_FIELDS if p[0] != "bench"],
        *SHOWN_FIELDS,
    ]
    header = ["group", "runs with provenance"] + [lab for lab, _ in fields]
    rows = []
    for group, provs in groups:
        known = [p for p in provs if p]
        cells = [group, f"{len(known)}/{len(provs)}"]
        for _, path in fields:
            values = list(dict.fromkeys(_fmt(field(p, path)) for p in known))
            cells.append(" / ".join(values) if values else "")
        rows.append(cells)
    return header, rows


def check(runs: Sequence[tuple[str, str, Mapping[str, Any] | None]]) -> tuple[list[str], list[str], list[list[str]]]:
    """(warnings, header, per-group rows) for ``runs`` ([(group, seed, summary.json or None)]). Runs
    without a summary (missing, still running) carry nothing to compare and are left out."""
    with_summary = [(g, seed, run_provenance(s)) for g, seed, s in runs if s is not None]
    warnings = provenance_warnings([(f"{g} seed={seed}", p) for g, seed, p in with_summary])
    by_group: dict[str, list[Mapping[str, Any] | None]] = {}
    for g, _, p in with_summary:
        by_group.setdefault(g, []).append(p)
    header, rows = provenance_rows(list(by_group.items()))
    return warnings, header, rows


def run_provenance(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The provenance object of a run's summary (None when absent or not an object)."""
    prov = (summary or {}).get("provenance")
    return dict(prov) if isinstance(prov, Mapping) else None

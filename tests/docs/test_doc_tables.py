"""The option tables of docs/configuration.md state what conf/ and the registries hold:
every group's options are its YAML files, every built-in option's parameters are named in its group's
row, and the registry tables list every axis and every built-in option."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from prorl_bench import registry
from prorl_bench.searchpath import CONF_DIR

ROOT = Path(__file__).resolve().parents[2]


def _rows(text: str, header: str) -> list[list[str]]:
    """The cells of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))])
    return rows


def _names(cell: str) -> set[str]:
    return set(re.findall(r"`([\w./-]+)", cell))  # `name` or `name: values`


def _params_of_group(group: str) -> set[str]:
    """Every parameter key of the built-in options the group's YAML files select."""
    reg = next((r for r in registry.AXES if r.section == group), None)
    if reg is None:
        return set()
    return {f.name for name in reg.names() if (cls := reg.params_class(name)) for f in fields(cls)}


def test_group_table_matches_conf_and_the_options_parameters():
    rows = _rows((ROOT / "docs" / "configuration.md").read_text(), "| group | options | what it sets |")
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
    seen = set()
    for group_cell, options, sets in rows:
        group = group_cell.strip("`")
        seen.add(group)
        assert group in groups, f"docs/configuration.md lists group {group!r}, conf/ has none"
        on_disk = {p.stem for p in (CONF_DIR / group).glob("*.yaml")}
        listed = _names(re.sub(r"\([^()]*\)", "", options))  # not the notes in parentheses
        assert listed == on_disk, (
            f"docs/configuration.md row {group}: {sorted(listed)} != conf/{group}/ {sorted(on_disk)}"
        )
        missing = _params_of_group(group) - _names(sets)
        assert not missing, f"docs/configuration.md row {group} does not name the parameters {sorted(missing)}"
    assert seen == groups, f"groups without a row in docs/configuration.md: {sorted(groups - seen)}"


def test_configuration_tables_match_the_registries():
    text = (ROOT / "docs" / "configuration.md").read_text()
    axes = _rows(text, "| axis | registry | register with | select with |")
    assert {r[1].strip("`") for r in axes} == {
        name for name, obj in vars(registry).items() if isinstance(obj, registry.Registry) and obj in registry.AXES
    }
    kl = _rows(text, "| name | value | use |")
    builtin_kl = {n for n in registry.KL_ESTIMATORS.names() if registry.KL_ESTIMATORS[n].__module__.startswith("prorl")}
    assert {r[0].strip("`") for r in kl} == builtin_kl
    opt = _rows(text, "| `opt_reset` | m | v | `step` | LR schedule |")
    assert {r[0].split()[0].strip("`") for r in opt} == set(registry.OPT_TRANSFORMS.names())
    for row in opt:  # each transform's parameters appear in its row
        name = row[0].split()[0].strip("`")
        cls = registry.OPT_TRANSFORMS.params_class(name)
        assert {f.name for f in fields(cls)} <= _names(" ".join(row)) if cls else True

"""The named regimes in conf/regime (docs/regime.md): each preset sets exactly the keys it documents,
the default is v2 (issue 22: no positional trap, still learning at step 300), the old behaviour stays
selectable as v1_trap, and command-line overrides win over a preset."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
from omegaconf import OmegaConf

from prorl_bench.cli.app import CONF_DIR
from tests.conftest import make_config

# What each preset promises (conf/regime/*.yaml and docs/regime.md); lengths come from the task file.
PRESETS: dict[str, dict[str, Any]] = {
    "v1_trap": {
        "task.name": "reverse_digits",
        "task.min_len": 3,
        "task.max_len": 5,
        "model.positions": "learned",
        "algo.lr": 1e-3,
        "steps": 150,
    },
    "v2": {
        "task.name": "sort_digits",
        "task.min_len": 3,
        "task.max_len": 5,
        "model.positions": "answer",
        "algo.lr": 1e-4,
        "steps": 300,
    },
}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config dict -> {"a.b.c": value} (lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def _keys(overrides: list[str]) -> dict[str, Any]:
    return _flat(asdict(make_config(overrides)))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_sets_its_keys(name):
    cfg = _keys([f"regime={name}"])
    for key, want in PRESETS[name].items():
        assert cfg[key] == want, (name, key, cfg[key])


def test_default_is_v2():
    # the composed default equals regime=v2 key for key, and differs from the old default (v1_trap)
    assert _keys([]) == _keys(["regime=v2"]) != _keys(["regime=v1_trap"])


def test_v2_differs_from_v1_only_where_it_says():
    v1, v2 = _keys(["regime=v1_trap"]), _keys(["regime=v2"])
    changed = {k for k in v1 if v1[k] != v2[k]}
    assert changed == {"task.name", "model.positions", "algo.lr", "steps"}, changed


def test_command_line_wins_over_the_preset():
    cfg = _keys(["regime=v2", "task=reverse_digits", "algo.lr=1e-3", "task.max_len=7"])
    assert (cfg["task.name"], cfg["algo.lr"], cfg["task.max_len"]) == ("reverse_digits", 1e-3, 7)
    assert cfg["model.positions"] == "answer"  # the key not overridden keeps the preset's value


def test_another_task_keeps_its_own_lengths_under_either_regime():
    # a preset that pinned task lengths would silently give task=add 3-5 digits per operand instead of its own
    own = OmegaConf.load(f"{CONF_DIR}/task/add.yaml")
    for regime in PRESETS:
        cfg = make_config(["task=add", f"regime={regime}"])
        assert (cfg.task.min_len, cfg.task.max_len) == (own.min_len, own.max_len), regime

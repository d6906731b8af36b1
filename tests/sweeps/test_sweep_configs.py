"""Every named grid in sweeps/ composes, defaults to the joblib launcher, lets the command line win
over its own values, and expands only to jobs whose configs validate."""

from __future__ import annotations

import itertools

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from prorl_bench.config import register_configs, to_config
from prorl_bench.searchpath import CONF_DIR, SWEEPS_DIR

register_configs()
GRIDS = sorted(p.stem for p in (SWEEPS_DIR / "sweep").glob("*.yaml"))


def _compose(overrides: list[str], hydra: bool = True):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra)


def _validate(overrides: list[str]):
    return to_config(_compose(overrides, hydra=False))


def _jobs(params: dict, cli: list[str]) -> list[list[str]]:
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + cli)
    return BasicSweeper.split_arguments(parsed, None)[0]


def test_expected_grids_exist():
    assert {"ablation", "ablation_small", "kl_estimator", "reset_semantics"} <= set(GRIDS)


@pytest.mark.parametrize("grid", GRIDS)
def test_grid_composes_with_joblib_and_every_job_validates(grid, request):
    cfg = _compose([f"+sweep={grid}"])
    # a grid on a Hugging Face model takes its directory on the command line (a tiny one, built offline)
    hf = [f"model.path={request.getfixturevalue('tiny_hf_dir')}"] if cfg.model.kind == "hf_causal_lm" else []
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")
    assert cfg.hydra.sweep.dir.startswith(f"outputs/sweeps/{grid}/")
    params = dict(cfg.hydra.sweeper.params)
    assert "seed" in params and _n_values("seed", params["seed"]) >= 2, "every grid spans seeds"
    jobs = _jobs(params, [f"+sweep={grid}"])
    assert len(jobs) == _product_size(params)
    # a grid must not contain combinations the config rejects (seeds cannot make a config invalid)
    # (each distinct job with its first seed: a study's block admits only its own seeds)
    first_seed: dict[tuple, list[str]] = {}
    for j in jobs:
        first_seed.setdefault(tuple(o for o in j if not o.startswith("seed=")), [o for o in j if o.startswith("seed=")])
    for job, seed in first_seed.items():
        _validate(list(job) + seed + hf)


def _n_values(key: str, value) -> int:
    """How many values a sweep parameter expands to (``a,b,c`` or ``range(0,16)``)."""
    override = OverridesParser.create().parse_overrides([f"{key}={value}"])[0]
    return len(list(override.sweep_iterator())) if override.is_discrete_sweep() else 1


def _product_size(params: dict) -> int:
    sizes = [_n_values(k, v) for k, v in params.items()]
    return len(list(itertools.product(*[range(s) for s in sizes])))


def test_command_line_overrides_the_grid():
    params = dict(_compose(["+sweep=ablation"]).hydra.sweeper.params)
    jobs = _jobs(params, ["+sweep=ablation", "seed=7", "+arm=A1,B", "steps=5"])
    assert sorted(tuple(sorted(j)) for j in jobs) == sorted(
        tuple(sorted([f"+arm={v}", "seed=7", "+sweep=ablation", "steps=5"])) for v in ("A1", "B")
    )
    cfg = _compose(["+sweep=ablation", "steps=5", "hydra/launcher=slurm"])
    assert cfg.steps == 5
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher") and cfg.hydra.launcher.cpus_per_task == 1


def test_ablation_arms_select_their_variant_and_c_resets():
    for arm in ("A0", "A1", "A2", "B", "C"):
        conf = _validate(["+sweep=ablation", f"+arm={arm}"])
        assert conf.variant.name == arm
        assert (conf.reset.trigger != "none") == (arm == "C")


def test_kl_grid_pairs_are_valid_and_distinct():
    names = sorted(p.stem for p in (SWEEPS_DIR / "kl_setup").glob("*.yaml"))
    seen = set()
    for name in names:
        conf = _validate(["+sweep=kl_estimator", f"+kl_setup={name}"])
        weighted = bool(getattr(conf.kl_estimator.params, "importance_weight", False))
        pair = (conf.kl_estimator.name + ("iw" if weighted else ""), conf.kl_estimator.placement.value)
        assert f"{pair[0]}_{pair[1]}" == name
        seen.add(pair)
    assert ("k1", "reward") in seen and ("k1", "loss") not in seen and ("k3iw", "loss") in seen and len(seen) == 6

"""Studies declare their question before they run: the ``study:`` node is validated (no primary
endpoint, an unknown key, overlapping blocks are refused), and ``study.block=confirm`` runs the same
grid on a disjoint seed block."""

from __future__ import annotations

import pytest
import yaml
from hydra import compose, initialize_config_dir

from prorl_bench.cli.sweep import plan_jobs
from prorl_bench.config import register_configs, to_config
from prorl_bench.config.study import StudyConfig, study_from_dict
from prorl_bench.registry import ConfigError
from prorl_bench.searchpath import CONF_DIR, SWEEPS_DIR

register_configs()
STUDIES = [
    "reset_semantics", "adam_step_hazard", "coverage", "routing", "ablation", "ablation_small",
    "reset_map", "kl_placement", "coverage_k256",
]  # fmt: skip
GOOD = {
    "question": "q?",
    "primary": [{"metric": "val_pass1_final", "direction": "higher", "margin": 0.03}],
    "baseline": "keep",
    "blocks": {"explore": "range(0,8)", "confirm": "range(8,16)"},
}


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize("name", STUDIES)
def test_every_named_study_declares_its_question(name):
    raw = yaml.safe_load((SWEEPS_DIR / "sweep" / f"{name}.yaml").read_text())
    assert raw["study"]["primary"], f"{name}: no primary endpoint"
    study = to_config(_compose([f"+sweep={name}"])).study
    assert isinstance(study, StudyConfig) and study.declared and study.block == "explore" and study.baseline
    assert not set(study.seeds("explore")) & set(study.seeds("confirm"))


@pytest.mark.parametrize("name", ["reset_semantics", "ablation_small", "reset_map", "kl_placement"])
def test_the_confirm_block_is_the_same_grid_on_disjoint_seeds(name):
    explore = plan_jobs([f"+sweep={name}"])
    confirm = plan_jobs([f"+sweep={name}", "study.block=confirm"])
    study = to_config(_compose([f"+sweep={name}"])).study

    def seeds(jobs):
        return {int(o.split("=")[1]) for j in jobs for o in j if o.startswith("seed=")}

    assert seeds(explore) == set(study.seeds("explore")) and seeds(confirm) == set(study.seeds("confirm"))
    assert not seeds(explore) & seeds(confirm)

    def rest(jobs):  # everything but the seed and the block selector: identical
        return sorted({tuple(o for o in j if not o.startswith(("seed=", "study.block="))) for j in jobs})

    assert rest(explore) == rest(confirm) and len(explore) == len(confirm)
    # every confirm job validates, its config records the block
    job = next(j for j in confirm if "seed=" in " ".join(j))
    assert to_config(_compose(list(job))).study.block == "confirm"


# The cross-engine study's design (docs/engines.md, "Cross-engine evidence"): 10 seeds per block, and
# neither block reuses the seeds that sized it (the 2-seed pilot) or the earlier 2-seed run's.
XENGINE_EXCLUDED = {900, 901, 0, 1, 16, 17}


def test_the_cross_engine_study_is_the_same_grid_on_both_engines(tiny_hf_dir):
    path = f"model.path={tiny_hf_dir}"

    def jobs(engine, block):
        return plan_jobs(["+sweep=adam_step_hazard_xengine", path, f"engine={engine}", f"study.block={block}"])

    def seeds(js):
        return {int(o.split("=")[1]) for j in js for o in j if o.startswith("seed=")}

    for block in ("explore", "confirm"):
        native, trl = jobs("native", block), jobs("trl", block)
        assert len(native) == len(trl) == 4 * 10 and len(seeds(native)) == 10
        strip = [[o for o in j if not o.startswith("engine=")] for j in trl]
        assert strip == [[o for o in j if not o.startswith("engine=")] for j in native]  # only engine= differs
        assert not seeds(native) & XENGINE_EXCLUDED
        for job in (native[0], trl[0]):
            assert to_config(_compose(list(job))).study.block == block  # every job validates
    assert not seeds(jobs("native", "explore")) & seeds(jobs("native", "confirm"))


def test_a_study_without_a_primary_endpoint_is_refused():
    with pytest.raises(ConfigError, match="study.primary is empty"):
        study_from_dict({**GOOD, "primary": []})
    with pytest.raises(ConfigError, match="study.primary is empty"):
        to_config(_compose(["+sweep=reset_semantics", "study.primary=[]"]))
    with pytest.raises(ConfigError, match="study.primary is empty"):
        study_from_dict({k: v for k, v in GOOD.items() if k != "primary"})
    with pytest.raises(ConfigError, match="no study is declared"):  # kl_estimator is a plain grid
        to_config(_compose(["+sweep=kl_estimator", "study.block=confirm"]))
    assert not to_config(_compose(["+sweep=kl_estimator"])).study.declared


def test_unknown_keys_and_bad_values_are_refused():
    with pytest.raises(ConfigError, match="primry"):
        study_from_dict({**GOOD, "primry": []})
    with pytest.raises(ConfigError, match="unknown config key study.primry"):
        to_config(_compose(["+sweep=reset_semantics", "+study.primry=[]"]))
    with pytest.raises(ConfigError, match="not a per-run metric"):
        study_from_dict({**GOOD, "primary": [{"metric": "val_pas1_final", "direction": "higher"}]})
    with pytest.raises(ConfigError, match="direction is required"):
        study_from_dict({**GOOD, "primary": [{"metric": "val_pass1_final"}]})
    with pytest.raises(ConfigError, match="margin"):
        study_from_dict({**GOOD, "primary": [{"metric": "val_pass1_final", "direction": "higher", "margin": -1}]})
    with pytest.raises(ConfigError, match="lists a metric twice"):
        study_from_dict({**GOOD, "primary": GOOD["primary"] * 2})
    with pytest.raises(ConfigError, match="seed 7 is in both"):
        study_from_dict({**GOOD, "blocks": {"explore": "range(0,8)", "confirm": "range(7,9)"}})
    with pytest.raises(ConfigError, match="missing \\['confirm'\\]"):
        study_from_dict({**GOOD, "blocks": {"explore": "range(0,8)"}})
    with pytest.raises(ConfigError, match="study.block='replicate'"):
        study_from_dict({**GOOD, "block": "replicate"})
    with pytest.raises(ConfigError, match="study.baseline is empty"):
        study_from_dict({**GOOD, "baseline": ""})
    assert study_from_dict(GOOD).seeds("confirm") == list(range(8, 16))


def test_a_run_on_a_seed_outside_its_block_is_refused():
    to_config(_compose(["+sweep=reset_semantics", "study.block=confirm", "seed=16"]))
    with pytest.raises(ConfigError, match="seed=3 is not in study block 'confirm'"):
        to_config(_compose(["+sweep=reset_semantics", "study.block=confirm", "seed=3"]))


@pytest.mark.parametrize("name,stratum", [("prolonged", 0.5), ("prolonged_low", 0.1)])
def test_each_prolonged_arm_runs_at_its_own_beta_in_one_sweep_directory(name, stratum):
    """The jobs as the sweeper composes them (its +prolonged_arm=... before the command line's +sweep=...):
    every arm runs at the stratum's beta except the beta0 control, which runs at 0. (The first explore
    block's beta0 arm set algo.beta itself, the sweep file set it again afterwards, and it ran at 0.5:
    16 runs identical to A1's.) Every job's sweep directory is the stratum's, whatever its arm's beta."""
    jobs = plan_jobs([f"+sweep={name}"]) + (
        [["+prolonged_arm=beta0", "seed=0", f"+sweep={name}"]] if name != "prolonged" else []
    )
    seen = {}
    for job in jobs:
        arm = next(o.split("=", 1)[1] for o in job if o.startswith("+prolonged_arm="))
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(job), return_hydra_config=True)
        assert f"/beta{stratum}/" in cfg.hydra.sweep.dir, (arm, cfg.hydra.sweep.dir)
        seen[arm] = to_config(_compose(list(job))).algo.beta
    assert seen.pop("beta0") == 0.0
    assert set(seen.values()) == {stratum} and "A1" in seen and "B" in seen

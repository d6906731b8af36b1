"""Every option of every group composes; typos and bad values fail early with a clear message."""

import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from prorl_bench.app import CONF_DIR
from prorl_bench.config import ConfigError

from .conftest import compose_cfg, make_config

GROUPS = sorted(p.name for p in Path(CONF_DIR).iterdir() if p.is_dir())
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((Path(CONF_DIR) / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_validates(group, option, request):
    overrides = [f"{group}={option}"]
    if group == "model" and option == "hf_causal_lm":  # needs a local checkpoint (built, not downloaded)
        overrides.append(f"model.path={request.getfixturevalue('tiny_hf_dir')}")
    if group == "task" and option in ("gsm", "code"):  # chat prompts need an HF tokenizer; code an HF model
        overrides += ["model=hf_causal_lm", f"model.path={request.getfixturevalue('tiny_hf_dir')}"]
    if group == "reset":
        overrides.append("variant=C")  # resets are variant C's
    if group == "growth":
        overrides.append("adapter=lora")  # growth grows adapters
    if group == "detector":
        overrides.append("adapter=dual_lora")  # detectors route between the dual adapters
    if group == "hardware" and option == "cuda":
        cfg = make_config(overrides)  # validates without a GPU; the device is resolved at run time
        assert cfg.hardware.device.value == "cuda"
        return
    cfg = make_config(overrides)
    assert cfg is not None


def test_defaults_are_the_documented_experiment():
    cfg = make_config()
    assert cfg.task.name == "reverse_digits" and cfg.variant.name == "A1"
    assert cfg.kl_estimator.name == "k3" and cfg.algo.advantage == "grpo"


def test_unknown_option_lists_available_options():
    with pytest.raises(ConfigCompositionException, match="Available options"):
        compose_cfg(["variant=Z"])


def test_misspelled_key_fails():
    with pytest.raises(ConfigCompositionException, match="lrr"):
        compose_cfg(["algo.lrr=0.1"])


def test_enum_value_lists_allowed_values():
    with pytest.raises((ConfigCompositionException, ValidationError)) as info:
        compose_cfg(["algo.loss_agg=foo"])
    message = f"{info.value} {info.value.__cause__}"
    assert "algo.loss_agg" in message and "token" in message


@pytest.mark.parametrize(
    "override,allowed",
    [
        ("algo.advantage=foo", "allowed grpo, rloo, reinforce_pp_baseline, dr_grpo"),
        ("kl_estimator.name=k4", "allowed k1, k2, k3"),
        ("task.name=nope", "reverse_digits"),
        ("reset.trigger=sometimes", "periodic"),
        ("opt_reset.kind=medium", "allowed keep, hard, soft, asym"),
    ],
)
def test_registry_value_lists_registered_names(override, allowed):
    """Pluggable axes are validated against their registries, before anything runs."""
    key, value = override.split("=")
    with pytest.raises(ConfigError, match=f"invalid config value {key}='{value}'") as info:
        make_config([override, "variant=C"] if key.startswith("reset") else [override])
    assert allowed in str(info.value)


@pytest.mark.parametrize(
    "override,key",
    [
        ("algo.eps_low=-0.1", "algo.eps_low"),
        ("algo.group_size=1", "algo.group_size"),
        ("algo.minibatches=3", "algo.minibatches"),
        ("algo.lr=0", "algo.lr"),
        ("model.n_heads=3", "model.n_heads"),
        ("task.max_len=2", "task.max_len"),
        ("kl_estimator=k1", "kl_estimator.placement"),  # k1 in the loss has no gradient
        ("kl_estimator.placement=reward", "kl_estimator.placement"),  # 'variant=A1' ok: see below
        ("kl_estimator=k2", None),
        ("model.max_seq_len=8", "model.max_seq_len"),
        ("hardware.torch_threads=0", "hardware.torch_threads"),
    ],
)
def test_out_of_range_values_name_the_key(override, key):
    overrides = [override]
    if override == "kl_estimator=k1":
        overrides.append("kl_estimator.placement=loss")
    if override == "kl_estimator.placement=reward":
        overrides.append("variant=B")
    if key is None:
        make_config(overrides)
        return
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make_config(overrides)


def test_k2_ref_over_old_is_never_a_differentiable_penalty():
    with pytest.raises(ConfigError, match="k2_mode"):
        make_config(["kl_estimator=k2", "kl_estimator.k2_mode=ref_over_old"])
    cfg = make_config(["kl_estimator=k2", "kl_estimator.k2_mode=ref_over_old", "kl_estimator.placement=reward"])
    assert cfg.kl_estimator.placement.value == "reward"


def _cli(*args, cwd):
    exe = Path(sys.executable).with_name("prorl-bench")
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_cli_bad_value_exits_nonzero_with_message(tmp_path):
    r = _cli("algo.eps_low=-1", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode != 0
    assert "algo.eps_low" in r.stderr and "allowed" in r.stderr
    assert '"status": "failed"' in (tmp_path / "run" / "summary.json").read_text()


def test_cli_unknown_option_exits_nonzero(tmp_path):
    r = _cli("variant=Z", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode != 0
    assert "Could not find 'variant/Z'" in r.stderr and "A1" in r.stderr


def test_missing_extra_names_setting_and_install_command(monkeypatch):
    import sys

    from prorl_bench.extras import require_extra

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    expected = r"task.name=reasoning_gym needs the 'reasoning' extra .*prorl-bench\[reasoning\]"
    with pytest.raises(ConfigError, match=expected):
        require_extra("reasoning_gym", "task.name=reasoning_gym", "reasoning")


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["variant=A1", "variant.reference=recompute"], "variant.reference"),  # A1 is the cached preset
        (["variant=C", "variant.resets=false"], "variant.resets"),
        (["variant.reference=teleport"], "variant.reference"),
        (["variant.name=A1 x"], "variant.name"),
    ],
)
def test_variant_presets_are_fixed(overrides, key):
    with pytest.raises(ConfigError, match=f"invalid config value {key}="):
        make_config(overrides)


def test_custom_variant_over_the_reference_axes():
    """A new combination under its own name: the recompute strategy with resets allowed."""
    cfg = make_config(["variant.name=A0C", "variant.reference=recompute", "variant.resets=true", "reset=periodic"])
    assert (cfg.variant.name, cfg.variant.reference, cfg.variant.resets) == ("A0C", "recompute", True)
    with pytest.raises(ConfigError, match="kl_estimator.placement"):  # recompute has no per-rollout cache
        make_config(["variant.name=X", "variant.reference=recompute", "kl_estimator.placement=reward"])


def test_config_dirs_prefer_the_copy_a_wheel_ships(tmp_path, monkeypatch):
    from prorl_bench import searchpath

    assert searchpath.CONF_DIR == searchpath.ROOT / "conf"  # a checkout / editable install
    monkeypatch.setattr(searchpath, "PACKAGE", tmp_path)
    assert searchpath._pick("_conf", "conf") == searchpath.ROOT / "conf"
    (tmp_path / "_conf").mkdir()
    assert searchpath._pick("_conf", "conf") == tmp_path / "_conf"  # inside an installed package

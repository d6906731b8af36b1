"""Every option of every group composes; typos and bad values fail early with a clear message."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from prorl_bench.cli.app import CONF_DIR
from prorl_bench.config import ConfigError
from prorl_bench.rl.kl import KLEstimator
from tests.conftest import compose_cfg, make_config

GROUPS = sorted(p.name for p in Path(CONF_DIR).iterdir() if p.is_dir())
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((Path(CONF_DIR) / g).glob("*.yaml"))]


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_validates(group, option, request):
    overrides = [f"{group}={option}"]
    if group == "model" and option == "hf_causal_lm":  # needs a local checkpoint (built, not downloaded)
        overrides.append(f"model.path={request.getfixturevalue('tiny_hf_dir')}")
    if group == "task" and option in ("gsm", "code", "math_jsonl"):  # chat prompts need an HF tokenizer
        overrides += ["model=hf_causal_lm", f"model.path={request.getfixturevalue('tiny_hf_dir')}"]
    if group == "task" and option == "math_jsonl":  # your problems: the example the package ships
        from prorl_bench.tasks.math_jsonl_task import EXAMPLE

        overrides.append(f"task.path={EXAMPLE}")
    if group == "engine" and option == "trl":  # TRL trains Hugging Face models (the native policy is refused)
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
    # regime v2 (conf/regime/v2.yaml, docs/regime.md): sort_digits, positions from the answer start, lr 1e-4, 300 steps
    assert cfg.task.name == "sort_digits" and cfg.variant.name == "A1"
    assert cfg.model.positions == "answer" and cfg.algo.lr == 1e-4 and cfg.steps == 300
    assert cfg.kl_estimator.name == "k3" and cfg.algo.advantage == "grpo"


def test_unknown_option_lists_available_options():
    with pytest.raises(ConfigCompositionException, match="Available options"):
        compose_cfg(["variant=Z"])


def test_misspelled_key_fails():
    with pytest.raises(ConfigCompositionException, match="lrr"):
        compose_cfg(["algo.lrr=0.1"])


def test_enum_value_lists_allowed_values():
    with pytest.raises(ConfigError) as info:  # the schema types the composed config (config.to_config)
        make_config(["algo.loss_agg=foo"])
    assert "algo.loss_agg" in str(info.value) and "token" in str(info.value)


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


def test_importance_weighted_k3_is_a_loss_option_of_k3_only():
    """The weight pi_theta/pi_old is 1 in the reward (taken at pi_old): refused there, naming the key;
    k1/k2 have no such parameter: like another option's key on any axis (reset.every on reset=none),
    it does not reach them (a grid over estimators may carry it); k3 in the loss takes it."""
    with pytest.raises(ConfigError, match=r"kl_estimator\.importance_weight"):
        make_config(["kl_estimator.importance_weight=true", "kl_estimator.placement=reward"])
    k2 = make_config(["kl_estimator=k2", "kl_estimator.importance_weight=true"]).kl_estimator
    assert not hasattr(k2.params, "importance_weight")
    assert not KLEstimator("k2", k2.params).importance_weighted
    assert make_config(["kl_estimator.importance_weight=true"]).kl_estimator.params.importance_weight is True
    assert make_config([]).kl_estimator.params.importance_weight is False


def _cli(*args, cwd):
    exe = Path(sys.executable).with_name("prorl-bench")
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_cli_bad_value_exits_nonzero_with_message_and_leaves_no_run_directory(tmp_path):
    r = _cli("algo.eps_low=-1", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 2
    assert "config error: invalid config value algo.eps_low=-1" in r.stderr and "allowed" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()  # validated before Hydra made the directory: no clutter


def test_a_bad_value_in_a_job_is_still_recorded_as_failed(tmp_path, monkeypatch):
    """A job that reaches the run (a multirun job; a single run with the check skipped) and fails
    validation still writes its failed summary: nothing is dropped silently."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from prorl_bench.cli import app

    cfg = compose_cfg(["algo.eps_low=-1", f"run_dir={tmp_path / 'run'}"])

    class FakeHydra:  # what HydraConfig.get() gives a single run's job
        mode = RunMode.RUN
        runtime = OmegaConf.create({"output_dir": str(tmp_path / "hydra")})
        overrides = OmegaConf.create({"task": []})  # provenance records the job's overrides

    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: FakeHydra))
    with pytest.raises(SystemExit) as info:
        app.run(cfg)
    assert info.value.code == 2
    assert '"status": "failed"' in (tmp_path / "run" / "summary.json").read_text()


def test_slurm_launcher_without_slurm_is_one_line(tmp_path):
    env_path = str(Path(sys.executable).parent)  # prorl-bench's own directory, no srun
    exe = Path(sys.executable).with_name("prorl-bench")
    r = subprocess.run(
        [str(exe), "-m", "hydra/launcher=slurm", "seed=0,1", f"hydra.sweep.dir={tmp_path}/sweep"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": env_path},
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "srun" in lines[0] and "hydra/launcher=joblib" in lines[0], r.stderr
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize(
    "configured,multirun,env,cpus,want",
    [
        (None, False, {}, 3, (3, "the CPU affinity: 3 CPUs")),
        (None, False, {"OMP_NUM_THREADS": "1"}, 3, (1, "OMP_NUM_THREADS=1")),
        (None, False, {"OMP_NUM_THREADS": "2,1"}, 3, (2, "OMP_NUM_THREADS=2")),  # OpenMP's nested form
        (None, False, {"OMP_NUM_THREADS": "8"}, 3, (3, "OMP_NUM_THREADS=8 capped at the CPU affinity: 3 CPUs")),
        (
            None,
            False,
            {"OMP_NUM_THREADS": "lots"},
            2,
            (2, "the CPU affinity: 2 CPUs; OMP_NUM_THREADS='lots' ignored: not a positive integer"),
        ),  # fmt: skip
        (None, True, {"OMP_NUM_THREADS": "8"}, 3, (1, "one per multirun job; hardware.torch_threads overrides")),
        (4, False, {"OMP_NUM_THREADS": "1"}, 3, (4, "hardware.torch_threads")),
    ],
)
def test_torch_threads_follow_affinity_and_omp_num_threads(configured, multirun, env, cpus, want):
    from prorl_bench.run.threads import resolve_threads

    assert resolve_threads(configured, multirun, environ=env, cpus=cpus) == want


def test_available_cpus_is_the_affinity_not_the_machine(monkeypatch):
    from prorl_bench.run import threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.available_cpus() == 2
    assert threads.resolve_threads(None, False) == (2, "the CPU affinity: 2 CPUs")
    monkeypatch.delattr(os, "sched_getaffinity")  # no affinity call (macOS): the CPU count
    assert threads.available_cpus() == 64


@pytest.mark.slow
def test_the_run_prints_its_thread_count(tmp_path, base_cache):
    exe = Path(sys.executable).with_name("prorl-bench")
    args = ["steps=1", "eval_every=1", "task.val_size=4", "eval.n_samples=2", "eval.ks=[1]", "progress=false",
            "warmup.target_success=0.05", f"warmup.cache_dir={base_cache}",
            f"hydra.run.dir={tmp_path}/run"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([str(exe), *args], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    assert "[prorl-bench] torch threads: 1 (from OMP_NUM_THREADS=1)" in r.stdout


def test_cli_unknown_option_exits_nonzero(tmp_path):
    r = _cli("variant=Z", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 2  # the bench's one-line config error (preflight.composition_problem), not Hydra's
    want = "prorl-bench: config error: variant=Z is not an option: variant is one of A0, A1, A2, B, C"
    assert r.stderr.strip() == want


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


# Audit item 1: +key overrides were dropped silently but recorded as applied
@pytest.mark.parametrize(
    "override,hint",
    [
        ("+algo.learning_rate=1e-5", "algo.lr"),
        ("+beta=0.5", "algo.beta"),
        ("+num_generations=4", "algo.group_size"),
        ("+algo.lrr=1", "algo.lr"),
        ("+max_completion_length=64", "algo.max_new_tokens"),
    ],
)
def test_unknown_keys_are_an_error_however_they_arrive(override, hint):
    with pytest.raises(ConfigError, match=rf"unknown config key {override[1:].split('=')[0]}.*{hint}"):
        make_config([override])


# Audit item 16: huge seeds overflowed at the first evaluation
@pytest.mark.parametrize("seed", [2**63 - 1, 1_700_000_000_000_000_000, -1])
def test_out_of_range_seeds_are_rejected(seed):
    with pytest.raises(ConfigError, match="seed"):
        make_config([f"seed={seed}"])


def test_the_largest_seed_runs(run_exp):
    summary, _ = run_exp([f"seed={2**24 - 1}", "steps=3", "growth=rank", "adapter=lora", "growth.grow_every=1"])
    assert summary["status"] == "completed"


# Audit item 15/17: temperature=1e-45 crashed in sampling; 1e30 failed the warm-up with advice about max_steps
@pytest.mark.parametrize("t", ["1e-45", "1e30", "0"])
def test_degenerate_temperatures_are_config_errors(t):
    with pytest.raises(ConfigError, match="algo.temperature"):
        make_config([f"algo.temperature={t}"])

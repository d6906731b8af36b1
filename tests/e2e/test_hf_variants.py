"""Every variant trains on the tiny local HF model; A0 = A1 = A2 trajectories hold there too."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from prorl_bench.config import (  # noqa: E402
    AlgoConfig,
    Config,
    HFImpl,
    ModelConfig,
    ModelKind,
    TaskConfig,
    VariantConfig,
    WarmupConfig,
)
from prorl_bench.run.trainer import train  # noqa: E402

TRAJECTORY_KEYS = ("reward/mean", "loss/total", "loss/pg", "loss/kl", "entropy", "grad_norm", "kl/ref")


def _cfg(path, variant: str, impl: HFImpl = HFImpl.auto, steps: int = 3, **warm) -> Config:
    return Config(
        task=TaskConfig(name="reverse_digits", min_len=2, max_len=3, val_size=4),
        variant=VariantConfig.preset(variant),
        model=ModelConfig(kind=ModelKind.hf_causal_lm, path=str(path), impl=impl),
        algo=AlgoConfig(prompts_per_step=2, group_size=4, minibatches=2, ppo_epochs=2),
        warmup=WarmupConfig(**warm),
        steps=steps,
        eval_every=steps,
        progress=False,
    )


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


VARIANTS = ["A0", "A1", "A2", "B", "C"]  # A0, A1, A2, B and C (C's resets come with the reset config)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_runs_on_the_hf_model(variant, tiny_hf_dir, tmp_path):
    summary = train(_cfg(tiny_hf_dir, variant), tmp_path / "run", tmp_path / "cache")
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    rows = _rows(tmp_path / "run")
    assert len(rows) == 3
    has_ref = variant != "B"
    assert all((r["count/ref_fwd"] > 0) == has_ref for r in rows)
    assert summary["base"]["warmup"] is False  # an HF model is its own base by default


@pytest.mark.parametrize("impl", [HFImpl.hf, HFImpl.fast])
def test_a0_a1_a2_identical_trajectories_on_hf(impl, tiny_hf_dir, tmp_path):
    runs = {}
    for v in ("A0", "A1", "A2"):
        train(_cfg(tiny_hf_dir, v, impl=impl), tmp_path / v, tmp_path / "cache")
        runs[v] = _rows(tmp_path / v)
    for key in TRAJECTORY_KEYS:
        a0, a1, a2 = ([r[key] for r in runs[v]] for v in ("A0", "A1", "A2"))
        assert a0 == a1 == a2, key
    for r0, r1 in zip(runs["A0"], runs["A1"]):
        assert r0["count/ref_fwd"] == 2 * 2 * r1["count/ref_fwd"]  # ppo_epochs x minibatches


def test_warmup_on_an_hf_model_is_opt_in_and_cached(tiny_hf_dir, tmp_path):
    cfg = _cfg(
        tiny_hf_dir,
        "A1",
        steps=1,
        enabled=True,
        target_success=0.05,
        max_steps=400,
        check_every=20,
        check_size=16,
        batch_size=32,
        lr=1e-2,
    )
    cfg.task = TaskConfig(name="copy", min_len=1, max_len=1, val_size=4)
    first = train(cfg, tmp_path / "a", tmp_path / "cache")
    assert first["base"]["cached"] is False and first["base"]["warmup_steps"] >= 20
    second = train(cfg, tmp_path / "b", tmp_path / "cache")
    assert second["base"]["cached"] is True


# Every reset trigger x optimizer transform of variant C, on the HF model (the reference is a frozen copy
# of the HF policy and resets rewrite it). Composed from conf/ exactly as the CLI does.
RESETS = [
    ["reset=periodic", "reset.every=2", "opt_reset=keep"],
    ["reset=periodic", "reset.every=2", "opt_reset=hard"],
    ["reset=periodic", "reset.every=2", "opt_reset=soft"],
    ["reset=periodic", "reset.every=2", "opt_reset=asym"],
    ["reset=polyak", "reset.every=2"],
    ["reset=kl_spike"],
    ["reset=stall", "reset.patience=1", "eval_every=1"],
    ["experiment=prorl_v1", "reset.patience=1", "eval_every=1"],
    ["experiment=prorl_v2", "reset.every=2"],
    ["experiment=trl_sync", "reset.every=2"],
    ["experiment=noma_soft", "reset.every=2"],
]


def _hf_small(model_dir) -> list[str]:
    """A 4-step run of the tiny local HF model on short inputs."""
    return [
        "model=hf_causal_lm",
        f"model.path={model_dir}",
        "steps=4",
        "progress=false",
        "algo.prompts_per_step=2",
        "algo.group_size=4",
        "task.min_len=2",
        "task.max_len=3",
        "task.val_size=4",
    ]


@pytest.mark.parametrize("overrides", RESETS, ids=lambda o: ",".join(o))
def test_every_reset_option_runs_on_the_hf_model(overrides, tiny_hf_dir, tmp_path):
    from tests.conftest import make_config

    base = ["variant=C", *_hf_small(tiny_hf_dir)]
    cfg = make_config(base + overrides)
    summary = train(cfg, tmp_path / "run", tmp_path / "cache")
    assert summary["status"] == "completed" and summary["steps_completed"] == 4
    if overrides[0] in ("reset=periodic", "reset=polyak") or "reset.every=2" in overrides:
        assert summary["resets"] >= 1


@pytest.mark.parametrize(
    "overrides",
    [
        ["adapter=lora"],  # default targets: qkv/proj/fc1/fc2 exist on the fast LLaMA path too
        ["adapter=lora", "growth=rank", "growth.grow_every=2", "growth.max_rank=8"],
        ["adapter=lora", "model.impl=hf", "adapter.targets=[q_proj,v_proj,o_proj,down_proj]"],
    ],
    ids=["lora", "lora+growth", "lora-hf-forward"],
)
def test_lora_and_growth_on_the_hf_model(overrides, tiny_hf_dir, tmp_path):
    from tests.conftest import make_config

    base = _hf_small(tiny_hf_dir)
    summary = train(make_config(base + overrides), tmp_path / "run", tmp_path / "cache")
    assert summary["status"] == "completed"
    rows = _rows(tmp_path / "run")
    assert all(r["adapter/rank"] >= 4 for r in rows)
    if "growth=rank" in overrides:
        assert rows[-1]["adapter/rank"] > rows[0]["adapter/rank"]


def test_a_run_that_never_earns_reward_says_so(tiny_hf_dir, tmp_path):
    """Warm-up is off for HF models: a random model earns nothing, and the run must say why."""
    from prorl_bench.run.outputs import read_jsonl
    from tests.conftest import make_config

    cfg = make_config([*_hf_small(tiny_hf_dir), "steps=10", "eval_every=10"])
    with pytest.warns(UserWarning, match="warmup.enabled=true"):
        train(cfg, tmp_path / "run", tmp_path / "cache")
    events = [e for e in read_jsonl(tmp_path / "run" / "events.jsonl") if e["event"] == "warning"]
    assert len(events) == 1 and events[0]["reason"] == "no_reward_signal" and events[0]["step"] == 10

"""Conformance of every registered option of every axis (built-ins and docs/extending.md's five plugins):

(a) its parameters reach every code path the run builds from it — the object the run calls holds the
    very instance the config validated (gradient routing's split path included);
(b) its state survives a checkpoint: the config round-trips through what checkpoints store, and a
    trigger's / reference's state_dict restores it mid-stream;
(c) changing its parameter changes what it computes (a metric of its own output).

A new option with parameters must add a changed value to ``CHANGED`` (the test fails until it does).
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest
import torch

from prorl_bench import registry
from prorl_bench.config import Config, as_dict, to_config
from prorl_bench.rl.advantages import advantage_estimator
from prorl_bench.rl.kl import build_kl
from prorl_bench.rl.opt_state import transform_factors
from prorl_bench.rl.resets import ResetSchedule
from prorl_bench.run.checkpoint import config_dict
from prorl_bench.run.routing import Router, subset_advantages
from prorl_bench.tasks.base import make_task
from prorl_bench.tasks.detectors import build_detector
from tests.conftest import make_config
from tests.e2e.test_plugins import plugin  # noqa: F401  (the docs' five modules, registered for the test)

# (registry key, option) -> overrides that select it, and a changed parameter (flat key = value)
SELECT = {
    "reset.trigger": lambda n: ["variant=C", f"reset.trigger={n}"],
    "variant.reference": lambda n: (
        ["variant.name=X", f"variant.reference={n}"] + (["variant.resets=true"] if n != "none" else [])
    ),
    "detector.name": lambda n: [f"detector.name={n}", "adapter=dual_lora", "task=hack_compete"],
    "kl_estimator.name": lambda n: (
        [f"kl_estimator.name={n}"] + (["kl_estimator.placement=reward"] if n == "k1" else [])
    ),
    "growth.kind": lambda n: [f"growth={n}", "adapter=lora"],
    "kl_ctl.kind": lambda n: [f"kl_ctl={n}"],
    "adapter.kind": lambda n: [f"adapter={n}"],
    "route.use": lambda n: [f"route.use={n}", "detector=reward_field", "adapter=lora", "task=hack_compete"],
    "task.name": lambda n: (
        [f"task.name={n}"] + (["model=hf_causal_lm", f"model.path={_hf_dir()}"] if n in ("math_jsonl", "code") else [])
    ),
    "engine.name": lambda n: [f"engine={n}", "model=hf_causal_lm", f"model.path={_hf_dir()}", "algo.adv_eps=1e-4"],
}
CHANGED = {
    ("reset.trigger", "periodic"): {"every": 3},
    ("reset.trigger", "polyak"): {"every": 3},
    ("reset.trigger", "kl_spike"): {"kl_threshold": 0.2},
    ("reset.trigger", "stall"): {"patience": 1},
    ("reset.trigger", "every_after"): {"every": 3},
    ("opt_reset.kind", "soft"): {"factor": 0.5},
    ("opt_reset.kind", "asym"): {"m_factor": 0.5},
    ("kl_estimator.name", "k2"): {"k2_mode": "ref_over_old"},
    ("kl_estimator.name", "k3"): {"importance_weight": True},
    ("kl_estimator.name", "abs_k1"): {"scale": 3.0},
    ("algo.advantage", "clipped_grpo"): {"clip": 0.5},
    ("task.name", "reverse_letters"): {"alphabet": "xy"},
    ("variant.reference", "ema"): {"rate": 0.5},
    ("detector.name", "pattern"): {"regex": "1"},
    ("detector.name", "reward_field"): {"threshold": 0.5},
    ("task.name", "reasoning_gym"): {"train_seed": 5},
    ("task.name", "code"): {"max_completion_tokens": 64},
    ("task.name", "math_jsonl"): {"val_path": "HELD_OUT"},  # a file of other questions (_math_files)
    ("growth.kind", "rank"): {"grow_every": 3},
    ("kl_ctl.kind", "adaptive"): {"target": 0.5},
    ("adapter.kind", "lora"): {"rank": 2},
    ("adapter.kind", "dual_lora"): {"forget_rank": 2},
    ("route.use", "penalize"): {"penalty": 0.25},
    ("engine.name", "trl"): {"gradient_checkpointing": True},
}


def _scratch() -> Path:
    """A temporary folder for this test process's shared files, removed when the process exits (the
    parametrize-time helpers below run outside any fixture, so pytest's tmp_path cannot hold them)."""
    import atexit
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="prorl-test-options-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def _hf_dir() -> str:
    """A tiny local Hugging Face model (engine=trl trains HF models), built once per test process."""
    from prorl_bench.models.tiny_hf import build_tiny_llama

    global _HF
    if _HF is None:
        _HF = str(build_tiny_llama(_scratch() / "tiny", hidden_size=32, n_layers=2, n_heads=4))
    return _HF


_HF: str | None = None
# parameters without a default, or a value the option needs whatever the test changes
REQUIRED = {
    ("detector.name", "pattern"): {"regex": "7$"},
    ("reset.trigger", "kl_spike"): {"kl_threshold": 0.5},
    ("task.name", "math_jsonl"): {"path": "EXAMPLE"},
}


@functools.cache
def _math_files(value: object) -> object:
    """``EXAMPLE`` / ``HELD_OUT`` as files: the shipped example, and a held-out file of questions not in it."""
    import json

    from prorl_bench.tasks.math_jsonl_task import EXAMPLE

    if value == "EXAMPLE":
        return str(EXAMPLE)
    if value != "HELD_OUT":
        return value
    path = _scratch() / "held_out.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in (101, 202))
    )
    return str(path)


def _options() -> list[tuple[registry.Registry, str]]:
    return [(reg, name) for reg in registry.AXES for name in reg.names()]


def _config(reg: registry.Registry, name: str, params: dict) -> Config:
    base = SELECT.get(reg.key, lambda n: [f"{reg.key}={n}"])(name)
    if reg.key == "kl_estimator.name" and params.get("k2_mode") == "ref_over_old":
        base.append("kl_estimator.placement=reward")
    given = {k: _math_files(v) for k, v in {**REQUIRED.get((reg.key, name), {}), **params}.items()}
    return make_config(base + [f"++{reg.section}.{k}={v}" for k, v in given.items()])


def _built(reg: registry.Registry, cfg: Config):
    """What the run builds from the section (the object it calls), and its bound parameters."""
    sec = getattr(cfg, reg.section)
    if reg is registry.RESET_TRIGGERS:
        return ResetSchedule(sec).trigger.params
    if reg is registry.KL_ESTIMATORS:
        return build_kl(sec).fn.params
    if reg is registry.DETECTORS:
        return build_detector(sec.name, sec.params).params
    if reg in registry.KINDS or reg is registry.ENGINES:  # the run hands the bound parameters to its code
        return _kind_object(reg, cfg).cfg if reg in (registry.GROWTH, registry.KL_CONTROLLERS) else sec.params
    return registry.AXES[registry.AXES.index(reg)].build(getattr(sec, reg.selector), sec.params).params


def _output(reg: registry.Registry, cfg: Config) -> object:
    """A figure the option computes, to compare across parameter values."""
    sec = getattr(cfg, reg.section)
    if reg is registry.RESET_TRIGGERS:
        sched, fired = ResetSchedule(sec), []
        for step in range(1, 13):
            sched.observe_step(step, 0.3 if step % 5 == 0 else 0.1)
            if step % 2 == 0:
                sched.observe_validation(0.5)
            if sched.due(step):
                fired.append(step)
                sched.mark_reset(step)
        return fired
    if reg is registry.OPT_TRANSFORMS:
        return transform_factors(sec)
    if reg is registry.KL_ESTIMATORS:
        kl, g = build_kl(sec), torch.Generator().manual_seed(0)
        a, b, c = (torch.randn(4, 5, generator=g) for _ in range(3))
        # |l| up to ~60: k2's ref_over_old form clamps the log-ratio at 10, the estimator does not;
        # c as pi_old's log-probs: k3's importance weight exp(a - c) (the others ignore it)
        return (kl(a, b, c).sum().item(), kl.reward(a, 20 * c).sum().item())
    if reg is registry.ADVANTAGES:
        rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]])
        return advantage_estimator(sec.advantage, sec.params, cfg.algo.adv_eps)(rewards).tolist()
    if reg is registry.TASKS:
        task = make_task(sec)
        return [p.prompt for p in task.sample_train(random.Random(0), 8)], task.max_completion_len
    if reg is registry.DETECTORS:
        det = build_detector(sec.name, sec.params)
        return [det("p", t, None, {"hack": h}) for t, h in (("17", 1.0), ("21", 0.3), ("3", 0.0))]
    if reg is registry.REFERENCES:
        return _reference_trace(cfg)
    if reg in registry.KINDS or reg is registry.ENGINES:
        return _kind_output(reg, cfg)
    raise AssertionError(reg.key)


def _kind_object(reg: registry.Registry, cfg: Config) -> object:
    """What the run builds from a kind's parameters (run/setup.py): the growth schedule, the KL controller."""
    from prorl_bench.rl.growth import GrowthSchedule
    from prorl_bench.rl.kl_control import KLController

    if reg is registry.GROWTH:
        return GrowthSchedule(cfg.growth.params, cfg.reset.metric)
    return KLController(cfg.algo.beta, cfg.kl_ctl.params)


def _kind_output(reg: registry.Registry, cfg: Config) -> object:
    """A figure each kind computes from its parameters: growth steps, betas, adapter sizes, shaped rewards,
    TRL's arguments."""
    if reg is registry.GROWTH:
        grow = _kind_object(reg, cfg)
        return [s for s in range(1, 13) if grow.due(s, 4, False)]
    if reg is registry.KL_CONTROLLERS:
        ctl = _kind_object(reg, cfg)
        return [ctl.update(0.2) for _ in range(3)]
    if reg is registry.ADAPTERS:
        from prorl_bench.run.setup import initial_state

        policy = _tiny_policy()
        initial_state(cfg, policy, make_task(cfg.task), (), torch.device("cpu"), 4)
        return sum(p.numel() for p in policy.parameters() if p.requires_grad)
    if reg is registry.ROUTE_USES:
        from prorl_bench.tasks.hack_task import CompeteTask

        router = Router(cfg, CompeteTask(cfg.task))
        router.labels = torch.tensor([True, False])
        return router.shape_rewards(torch.tensor([1.0, 1.0])).tolist()
    from prorl_bench.engines.trl.build import grpo_args  # engine=trl: the GRPOConfig it builds

    return grpo_args(cfg, Path(_hf_dir()) / "out", 8).gradient_checkpointing


def _tiny_policy():
    from prorl_bench.config import ModelConfig
    from prorl_bench.models.model import TransformerPolicy

    torch.manual_seed(0)
    return TransformerPolicy(ModelConfig(d_model=16, n_layers=1, n_heads=2), 16)


def _reference_trace(cfg: Config) -> list[float]:
    from prorl_bench.config import ModelConfig
    from prorl_bench.models.model import TransformerPolicy
    from prorl_bench.rl.reference import ReferenceContext, build_reference

    torch.manual_seed(0)
    policy = TransformerPolicy(ModelConfig(d_model=16, n_layers=1, n_heads=2), 16)
    ctx = ReferenceContext(policy, 1.0, (), 4, 4, 4, torch.device("cpu"))
    ref = build_reference(cfg.variant.reference, ctx, cfg.variant.params)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.1)
    ref.before_rollout(policy, 2)
    return [] if ref.model is None else [float(sum(p.sum() for p in ref.model.parameters()))]


@pytest.mark.usefixtures("plugin")
def test_every_option_with_parameters_has_a_changed_value_here():
    with_params = {(reg.key, n) for reg, n in _options() if reg.params_class(n) is not None}
    assert with_params - set(CHANGED) == set(), "add a changed parameter value for these options to CHANGED"


@pytest.mark.usefixtures("plugin")
@pytest.mark.parametrize("key,name", sorted(CHANGED))
def test_parameters_reach_the_run_survive_a_checkpoint_and_change_its_output(key, name):
    reg = next(r for r in registry.AXES if r.key == key)
    default, changed = _config(reg, name, {}), _config(reg, name, CHANGED[(key, name)])
    section = getattr(changed, reg.section)
    for k, v in CHANGED[(key, name)].items():  # (a) the value the user typed is the bound one
        assert getattr(getattr(section.params, k), "value", getattr(section.params, k)) == _math_files(v)
    assert _built(reg, changed) == section.params
    from omegaconf import OmegaConf

    from prorl_bench.run.export import _config_from_dict

    assert _config_from_dict(config_dict(changed)) == changed  # (b) what a checkpoint stores reads back
    assert to_config(OmegaConf.create(as_dict(changed))) == changed
    assert _output(reg, default) != _output(reg, changed)  # (c) the parameter changes what it computes


@pytest.mark.usefixtures("plugin")
def test_split_routing_uses_the_same_bound_estimator():
    """The issue's silent bug: an estimator with clip=0.5 gave 2.47 on the split path (its default)."""
    cfg = make_config(["++algo.clip=0.5", "algo.advantage=clipped_grpo", "adapter=dual_lora", "task=hack_compete",
                       "detector=reward_field", "route.advantages=split", "algo.group_size=8"])  # fmt: skip
    from prorl_bench.tasks.hack_task import CompeteTask

    router = Router(cfg, CompeteTask(cfg.task))
    rewards = torch.tensor([[1.0, 0, 0, 0, 0, 0, 0, 0], [1.0, 1, 0, 0, 0, 0, 0, 0]])
    router.labels = torch.zeros(16, dtype=torch.bool)
    router.labels[[5, 6, 7, 13]] = True
    adv, retain = router.advantages(rewards)
    assert adv.abs().max() == pytest.approx(0.5) and retain.abs().max() == pytest.approx(0.5)
    unclipped = subset_advantages(advantage_estimator("grpo"), rewards, ~router.labels.view(2, 8))
    assert unclipped.abs().max() > 1.5  # without the bound parameter the split path is not clipped


@pytest.mark.usefixtures("plugin")
@pytest.mark.parametrize("name", ["periodic", "polyak", "kl_spike", "stall", "every_after"])
def test_trigger_state_survives_a_checkpoint_mid_stream(name):
    stateful = {"kl_spike": {"kl_multiple": 1.5, "kl_warmup": 2}, "stall": {"patience": 3}}  # state matters
    params = stateful.get(name, CHANGED[("reset.trigger", name)])
    cfg = make_config(["variant=C", f"reset.trigger={name}", *(f"++reset.{k}={v}" for k, v in params.items())]).reset
    # kl/ref spikes every 5th step; the held-out metric improves until step 5, then stalls
    stream = [(s, 0.3 if s % 5 == 0 else 0.1 + 0.01 * s, min(s, 5) / 10) for s in range(1, 25)]

    def run(sched, steps):
        out = []
        for step, kl, val in steps:
            sched.observe_step(step, kl)
            sched.observe_validation(val)
            if sched.due(step):
                out.append(step)
                sched.mark_reset(step)
        return out

    whole = run(ResetSchedule(cfg), stream)
    for cut in (7, 9):  # mid-stall (stale evaluations counted); just before the spike at step 10
        first = ResetSchedule(cfg)
        head = run(first, stream[:cut])
        resumed = ResetSchedule(cfg)
        resumed.load_state_dict(first.state_dict())
        assert head + run(resumed, stream[cut:]) == whole, f"resumed after step {cut}"

"""Options from the user's own module (docs/extending.md): a module outside the package registers an
advantage estimator, a reset trigger with its own parameters, a task, a moving reference strategy
(an EMA of the policy) and a KL estimator; ``plugins=[module]`` makes them valid config values, and
they train from the command line. No package file is edited.

Also: ``kl/base`` of a reference that moves on its own is the KL to the true base (not ``kl/ref``),
and the ``prorl_bench.plugins`` entry-point group loads an installed plugin without ``plugins=``.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from prorl_bench import registry
from prorl_bench.config import ConfigError
from prorl_bench.run.outputs import read_jsonl

from .conftest import FAST, make_config

PLUGIN = '''
"""A user's options: five additions, one file."""
import random
from dataclasses import dataclass

import torch

from prorl_bench.rl.reference import CachedReference
from prorl_bench.registry import ADVANTAGES, KL_ESTIMATORS, REFERENCES, RESET_TRIGGERS, require
from prorl_bench.rl.resets import Trigger
from prorl_bench.tasks.base import symbol_task


@ADVANTAGES.register("mean_only")
def mean_only(rewards, eps=1e-6):
    """A mean-only group baseline: R - mean_g(R) (no std division)."""
    return rewards - rewards.mean(dim=1, keepdim=True)


@dataclass
class EveryAfterParams:
    every: int = 2  # steps between resets
    start: int = 3  # no reset at or before this step

    def __post_init__(self):
        require(self.every >= 1, "reset.params.every", self.every, ">= 1")


@RESET_TRIGGERS.register("every_after", params=EveryAfterParams)
class EveryAfter(Trigger):
    """Every params.every steps once the step is past params.start."""

    @classmethod
    def period(cls, cfg):
        return RESET_TRIGGERS.params("every_after", cfg.params, "reset.params").every

    def fire(self, step):
        p = self.params
        return f"every_after: every {p.every} after {p.start}" if step > p.start and step % p.every == 0 else None


def _letters(rng, n):
    x = "".join(rng.choice("abcd") for _ in range(n))
    return x, x[::-1]


symbol_task("reverse_letters", "L", lambda n: n + 2, lambda n: n, solve=lambda x: x[::-1])(_letters)


@dataclass
class EMAParams:
    rate: float = 0.1  # pi_ref <- rate * pi_theta + (1 - rate) * pi_ref before every rollout

    def __post_init__(self):
        require(0 < self.rate <= 1, "variant.params.rate", self.rate, "in (0, 1]")


@REFERENCES.register("ema", per_rollout=True, model=True, params=EMAParams)
class EMAReference(CachedReference):
    """The reference follows the policy as an exponential moving average (it moves on its own)."""

    moves = True

    def before_rollout(self, policy, step):
        if step > 1:  # at step 1 the policy is still the base
            self.reset_to(policy, self.params.rate)


@KL_ESTIMATORS.register("k1_abs", reward_only=False, clamped=False)
def k1_abs(logp, logp_ref, clamp=20.0):
    """|logp - logp_ref|: k1's magnitude (>= 0, a usable loss)."""
    return (logp - logp_ref).abs()
'''

NAMES = {
    registry.ADVANTAGES: "mean_only",
    registry.RESET_TRIGGERS: "every_after",
    registry.TASKS: "reverse_letters",
    registry.REFERENCES: "ema",
    registry.KL_ESTIMATORS: "k1_abs",
}


def _write_plugin(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(PLUGIN)
    return directory


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plugin imported in this process (as ``plugins=[...]`` would), unregistered afterwards."""
    name = "user_options_inproc"
    monkeypatch.syspath_prepend(str(_write_plugin(tmp_path / "plugin", name)))
    registry.load_plugins([name])
    yield name
    for reg, option in NAMES.items():
        reg.remove(option)
    sys.modules.pop(name, None)
    importlib.invalidate_caches()


def test_plugin_options_validate_with_their_own_parameters(plugin):
    cfg = make_config(
        [f"plugins=[{plugin}]", "variant.name=EMA", "variant.reference=ema", "variant.resets=true",
         "+variant.params.rate=0.25", "reset.trigger=every_after", "+reset.params.every=4",
         "task.name=reverse_letters", "algo.advantage=mean_only", "kl_estimator.name=k1_abs"]
    )  # fmt: skip
    assert cfg.variant.params == {"rate": 0.25} and cfg.reset.params == {"every": 4}
    bad = {
        "+reset.params.every=0": "reset.params.every=0: allowed >= 1",
        "+reset.params.evry=3": "unknown config key reset.params.evry: reset trigger 'every_after' takes every, start",
        "+reset.params.every=x": "reset.params",
    }
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            make_config([f"plugins=[{plugin}]", "variant=C", "reset.trigger=every_after", override])
    with pytest.raises(ConfigError, match="variant.params.rate=2.0: allowed in"):
        make_config(["variant.name=EMA", "variant.reference=ema", "+variant.params.rate=2.0"])
    with pytest.raises(ConfigError, match="reset trigger 'periodic' takes no parameters"):
        make_config(["variant=C", "reset=periodic", "+reset.params.every=3"])


def test_step_counter_warning_reads_the_triggers_declared_period(plugin):
    """The warning knows nothing of trigger names: a plugin trigger that declares a short period gets it."""
    from prorl_bench.rl.resets import StepCounterHazardWarning

    hazard = ["variant=C", "reset.trigger=every_after", "opt_reset=soft"]
    with pytest.warns(StepCounterHazardWarning, match="every 5 steps"):
        make_config([*hazard, "+reset.params.every=5"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", StepCounterHazardWarning)
        make_config([*hazard, "+reset.params.every=100"])  # rare resets: no hazard


def test_missing_plugin_module_is_a_config_error():
    with pytest.raises(ConfigError, match="plugins='no_such_plugin_module'.*PYTHONPATH"):
        make_config(["plugins=[no_such_plugin_module]"])


def test_moving_reference_logs_the_kl_to_the_true_base(plugin, run_exp):
    """beta = 0: the reference does not touch the update, so an EMA run and an A1 run train the same
    trajectory; A1's reference *is* the base, so its kl/ref is the truth for the EMA run's kl/base."""
    moving = ["algo.beta=0", "algo.entropy_coef=0.05"]  # the entropy bonus moves the policy whatever the reward
    _, a1 = run_exp([*moving, "variant=A1"], "a1")
    ema_over = [*moving, "variant.name=EMA", "variant.reference=ema", "+variant.params.rate=0.5"]
    _, ema = run_exp([f"plugins=[{plugin}]", *ema_over], "ema")
    a1_rows, ema_rows = read_jsonl(a1 / "metrics.jsonl"), read_jsonl(ema / "metrics.jsonl")
    assert [r["reward/mean"] for r in a1_rows] == [r["reward/mean"] for r in ema_rows]  # same trajectory
    measured = [r for r in ema_rows if r["step"] % 3 == 0]  # FAST: eval_every=3 (regular validations)
    assert [r["step"] for r in measured] == [3, 6]
    for e in measured:
        truth = a1_rows[e["step"] - 1]["kl/ref"]
        assert e["kl/base"] == pytest.approx(truth, rel=1e-6, abs=1e-9)
        assert abs(e["kl/ref"] - truth) > 1e-3  # the moved reference is not the base: kl/ref is not kl/base
    assert ema_rows[0]["kl/base"] == ema_rows[0]["kl/ref"]  # step 1: the EMA has not moved yet
    assert all(r["kl/base"] is None for r in ema_rows[1:] if r["step"] % 3)  # moved, not measured (NaN: null)


@pytest.mark.slow
def test_plugin_options_train_from_the_command_line(tmp_path, base_cache):
    """``prorl-bench plugins=[user_options] ...`` with all five additions at once, in a subprocess."""
    plugin_dir = _write_plugin(tmp_path / "plugin", "user_options")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")]))
    run_dir = tmp_path / "run"
    cmd = [
        str(Path(sys.executable).with_name("prorl-bench")), "plugins=[user_options]",
        "task.name=reverse_letters", "task.min_len=2", "task.max_len=3", "algo.advantage=mean_only",
        "kl_estimator.name=k1_abs", "variant.name=EMA", "variant.reference=ema", "variant.resets=true",
        "+variant.params.rate=0.3", "reset.trigger=every_after", "+reset.params.every=2", "+reset.params.start=3",
        *FAST, "progress=false", f"warmup.cache_dir={base_cache}", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_completed"] == 6
    assert summary["reset_steps"] == [4, 6]  # the trigger's own parameters: every 2 steps after step 3
    resets = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "reset"]
    assert [e["reason"] for e in resets] == ["every_after: every 2 after 3"] * 2
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert samples and all(s["prompt"].startswith("L") and set(s["prompt"][1:-1]) <= set("abcd") for s in samples)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    # kl/ref is the configured estimator |l| averaged; kl/ref_k1 averages l itself: |mean l| <= mean |l|
    assert all(r["kl/ref"] >= abs(r["kl/ref_k1"]) - 1e-7 for r in rows)
    assert any(r["kl/ref"] > abs(r["kl/ref_k1"]) + 1e-6 for r in rows)  # and it is not k1 itself


def test_entry_point_plugin_loads_without_the_plugins_key(tmp_path):
    """An installed package that declares ``[project.entry-points."prorl_bench.plugins"]`` registers
    its options at the first registry lookup (a .dist-info on sys.path is what pip installs)."""
    site = _write_plugin(tmp_path / "site", "user_options_ep")
    dist = site / "user_options_ep-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: user-options-ep\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[prorl_bench.plugins]\nuser = user_options_ep\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    code = textwrap.dedent("""
        from prorl_bench.registry import ADVANTAGES, REFERENCES
        print("mean_only" in ADVANTAGES, "ema" in REFERENCES)
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "True"]

"""Variant C end to end: presets run, resets write events, the reference equals the policy."""

import pytest
import torch

from prorl_bench.run.outputs import read_jsonl
from tests.conftest import FAST, make_config, strip_timing


@pytest.mark.parametrize("preset", ["prorl_v1", "prorl_v2", "trl_sync", "noma_soft"])
def test_presets_run_end_to_end(run_exp, preset):
    extra = {"prorl_v1": ["reset.patience=1", "eval_every=2"], "trl_sync": ["reset.every=2"]}.get(preset, [])
    summary, d = run_exp([f"experiment={preset}", "reset.every=3", *extra], name=preset)
    assert summary["status"] == "completed"
    assert summary["resets"] >= 1
    events = [e for e in read_jsonl(d / "events.jsonl") if e["event"] == "reset"]
    assert len(events) == summary["resets"]
    for e in events:
        assert e["reason"] and "kl_before" in e and "kl_after" in e and "opt_reset" in e
    rows = read_jsonl(d / "metrics.jsonl")
    assert all("kl/beta" in r and "update_norm" in r and "reset" in r for r in rows)


def test_presets_pin_their_recipes():
    v1 = make_config(["experiment=prorl_v1"])
    assert (v1.reset.trigger, v1.opt_reset.kind, v1.algo.eps_high) == ("stall", "hard", 0.4)
    v2 = make_config(["experiment=prorl_v2"])
    assert (v2.reset.trigger, v2.opt_reset.kind, v2.kl_estimator.name) == ("periodic", "keep", "k2")
    assert (v2.algo.eps_high, v2.algo.advantage) == (0.27, "reinforce_pp_baseline")
    assert make_config(["experiment=trl_sync"]).reset.alpha == 0.6
    assert make_config(["experiment=noma_soft"]).opt_reset.kind == "soft"


def test_periodic_reset_makes_the_reference_equal_to_the_policy(base_cache, tmp_path, monkeypatch):
    import prorl_bench.rl.reference as reference
    import prorl_bench.run.trainer as trainer

    snapshots = []
    real = reference.reset_reference

    def spy(ref, policy, alpha=1.0, weights=None):
        real(ref, policy, alpha, weights)
        pairs = zip(ref.parameters(), policy.parameters())
        snapshots.append([(r.detach().clone(), p.detach().clone()) for r, p in pairs])

    monkeypatch.setattr(reference, "reset_reference", spy)
    cfg = make_config(FAST + ["variant=C", "reset=periodic", "reset.every=2", "opt_reset=hard"])
    summary = trainer.train(cfg, tmp_path / "c", base_cache)
    assert summary["reset_steps"] == [2, 4, 6] and len(snapshots) == 3
    assert all(torch.equal(r, p) for snap in snapshots for r, p in snap)
    resets = [e for e in read_jsonl(tmp_path / "c" / "events.jsonl") if e["event"] == "reset"]
    assert all(e["kl_after"] == 0.0 and e["step_reset"] and e["m_norm_after"] == 0.0 for e in resets)
    rows = read_jsonl(tmp_path / "c" / "metrics.jsonl")
    assert [r["reset"] for r in rows] == [0, 1, 0, 1, 0, 1]
    assert all(r["time/reset"] > 0 for r in rows if r["reset"])


def test_c_without_resets_equals_a1(run_exp):
    _, a1 = run_exp(["variant=A1"], name="a1")
    _, c = run_exp(["variant=C", "reset=none"], name="c")
    assert strip_timing(read_jsonl(a1 / "metrics.jsonl")) == strip_timing(read_jsonl(c / "metrics.jsonl"))


def test_resets_require_variant_c_and_adaptive_beta_is_logged(run_exp):
    from prorl_bench.config import ConfigError

    with pytest.raises(ConfigError, match="reset"):
        make_config(["variant=A1", "reset=periodic"])
    knobs = ["kl_ctl=adaptive", "kl_ctl.target=1e-6", "kl_ctl.horizon=1", "task.reward=partial"]
    _, d = run_exp(knobs, name="adaptive")
    betas = [r["kl/beta"] for r in read_jsonl(d / "metrics.jsonl")]
    assert betas[0] == 0.01 and betas[-1] > betas[0]  # KL above a tiny target: beta rises


def test_step_counter_hazard_warns_at_config_time():
    import warnings

    from prorl_bench.rl.resets import StepCounterHazardWarning

    hazard = ["variant=C", "reset=periodic", "reset.every=10", "opt_reset=soft", "opt_reset.factor=0.0"]
    with pytest.warns(StepCounterHazardWarning, match="ratchets up"):
        make_config(hazard)
    with pytest.warns(StepCounterHazardWarning):
        make_config(["variant=C", "reset=periodic", "reset.every=25", "opt_reset=asym", "opt_reset.v_factor=0.5"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", StepCounterHazardWarning)
        make_config([*hazard[:-2], "opt_reset=soft", "opt_reset.step=reset"])  # bias correction restarts
        make_config(["variant=C", "reset=periodic", "reset.every=100", "opt_reset=soft"])  # rare resets
        make_config(["variant=C", "reset=periodic", "reset.every=10", "opt_reset=asym"])  # v kept (v_factor 1)
        make_config(["variant=C", "reset=periodic", "reset.every=10", "opt_reset=hard"])

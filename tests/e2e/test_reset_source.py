"""``reset.source=best`` end to end: the reference becomes the best held-out policy so far, bit for bit;
the snapshot survives a resume; the first resets before any evaluation fall back to the current policy;
configs it cannot serve are refused up front.

The held-out scores are scripted (``validation_phase.pass1`` patched per step), so which evaluation is
best is known in advance and is *not* the policy at the reset — a reset that copied the current policy
instead fails every test here."""

from __future__ import annotations

import warnings

import pytest
import torch

from prorl_bench.config import ConfigError
from prorl_bench.run.checkpoint import load_verified
from prorl_bench.run.outputs import read_jsonl
from tests.conftest import FAST, make_config, strip_timing

# regular evaluations every 2 steps; the best is step 4, step 6 ties it (ties keep the earliest)
SCORES = {2: 0.25, 4: 0.5, 6: 0.5, 8: 0.125}
BEST = ["variant=C", "reset=periodic", "reset.every=6", "reset.source=best", "eval_every=2"]


@pytest.fixture
def scripted(monkeypatch):
    import prorl_bench.run.validation_phase as vp

    monkeypatch.setattr(vp, "pass1", lambda row: SCORES[row["step"]])


def _ckpt(run_dir, step):
    return load_verified(run_dir / "checkpoints" / f"step_{step:08d}.pt")


def _resets(run_dir):
    return [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "reset"]


def _adapter_names(policy_state):
    """LoRA layer names in module order (an AdapterReference's A{i}/B{i} follow it)."""
    return [k[: -len(".lora_A")] for k in policy_state if k.endswith(".lora_A")]


@pytest.mark.parametrize(
    "extra",
    [[], ["adapter=lora"], ["adapter=lora", "adapter.reference=copy"]],
    ids=["full", "lora-adapter-reference", "lora-copy-reference"],
)
def test_a_best_reset_makes_the_reference_the_best_checkpoint_bitwise(run_exp, scripted, extra):
    knobs = [*BEST, *extra, "checkpoint.every=1", "checkpoint.keep_last=10"]
    summary, d = run_exp(knobs, name="best")
    assert summary["reset_steps"] == [6]
    (event,) = _resets(d)
    assert (event["source"], event["best_step"], event["best_score"]) == ("best", 4, 0.5)
    assert event["kl_after"] > 0  # the reference is not the policy it was reset beside
    best_policy = _ckpt(d, 4)["policy"]
    after = _ckpt(d, 6)
    ref = after["reference"]
    if "adapter.reference=copy" in extra or not extra:  # a full copy: every parameter and buffer
        assert ref.keys() == best_policy.keys()
        pairs = [(ref[k], best_policy[k]) for k in ref]
    else:  # the adapter reference holds its own A_i, B_i; the base is shared with the policy
        names = _adapter_names(best_policy)
        assert len(names) > 0 and set(ref) == {f"{x}{i}" for i in range(len(names)) for x in "AB"}
        pairs = [(ref[f"A{i}"], best_policy[f"{n}.lora_A"]) for i, n in enumerate(names)]
        pairs += [(ref[f"B{i}"], best_policy[f"{n}.lora_B"]) for i, n in enumerate(names)]
    assert all(torch.equal(r, p) for r, p in pairs)
    moved = [k for k, v in best_policy.items() if not torch.equal(v, after["policy"][k])]
    assert moved, "the policy must have moved between steps 4 and 6, or this test cannot tell best from current"
    best = after["best"]
    assert (best["step"], best["score"]) == (4, 0.5)
    assert all(torch.equal(w, best_policy[n]) for n, w in best["weights"].items())


def test_best_so_far_survives_a_resume(run_exp, scripted):
    knobs = [*BEST, "steps=8", "checkpoint.every=1"]
    direct_summary, direct = run_exp(knobs, name="direct")
    run_exp([*BEST, "steps=5", "checkpoint.every=1"], name="resumed")  # stops after step 5: best = step 4
    resumed_summary, resumed = run_exp(knobs, name="resumed")  # resumes at 6, resets at 6
    assert direct_summary["reset_steps"] == resumed_summary["reset_steps"] == [6]

    def fields(d):
        return [{k: v for k, v in e.items() if not k.startswith("time")} for e in _resets(d)]

    assert fields(resumed) == fields(direct) and fields(direct)[0]["best_step"] == 4
    assert strip_timing(read_jsonl(resumed / "metrics.jsonl")) == strip_timing(read_jsonl(direct / "metrics.jsonl"))
    a, b = _ckpt(direct, 8), _ckpt(resumed, 8)
    assert all(torch.equal(a["reference"][k], b["reference"][k]) for k in a["reference"])


def test_resets_before_the_first_evaluation_fall_back_to_the_current_policy(run_exp, scripted):
    from prorl_bench.rl.resets import ResetSourceWarning

    knobs = ["variant=C", "reset=periodic", "reset.every=2", "reset.source=best", "eval_every=4", "steps=4"]
    with pytest.warns(ResetSourceWarning, match="eval_every=4"):
        make_config(FAST + knobs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResetSourceWarning)
        _, d = run_exp([*knobs, "checkpoint.every=1", "checkpoint.keep_last=10"], name="fallback")
    first, second = _resets(d)
    assert (first["step"], first["source"], first["best_step"]) == (2, "current", None)
    assert "no regular held-out evaluation yet" in first["source_reason"] and first["kl_after"] == 0.0
    assert (second["step"], second["source"], second["best_step"]) == (4, "best", 4)  # evaluated, then reset
    ck = _ckpt(d, 2)
    assert all(torch.equal(ck["reference"][k], ck["policy"][k]) for k in ck["reference"])


def test_source_current_adds_no_event_field(run_exp):
    _, d = run_exp(["variant=C", "reset=periodic", "reset.every=3"], name="current")
    events = _resets(d)
    assert events and not any({"source", "best_step", "best_score"} & set(e) for e in events)
    assert load_verified(sorted((d / "checkpoints").glob("*.pt"))[-1])["best"] is None


def test_configs_best_cannot_serve_are_refused_up_front():
    from prorl_bench.engines.trl.config_map import refusals

    with pytest.raises(ConfigError, match="reset.source='best'.*growth=rank"):
        make_config(["variant=C", "reset=periodic", "reset.source=best", "adapter=lora", "growth=rank"])
    with pytest.raises(ConfigError, match="reset.source"):
        make_config(["reset.source=latest"])
    cfg = make_config(["variant=C", "reset=periodic", "reset.source=best"])  # engine=trl's rules read any config
    assert dict(refusals(cfg))["reset.source"].startswith("not wired for engine=trl")
    assert "reset.source" not in dict(refusals(make_config(["variant=C", "reset=periodic"])))

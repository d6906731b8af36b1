"""Reference resets (rl/resets.py), tested as mathematics: a copy and a polyak mix of the weights, and
when each trigger fires (periodic, kl_spike, stall, spacing)."""

import copy

import pytest
import torch

from prorl_bench.config import ResetConfig
from prorl_bench.rl.resets import ResetSchedule, reset_reference

# ----------------------------------------------------------------------------- reference updates


def test_reference_copy_and_polyak_mix():
    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 4)
    ref = torch.nn.Linear(4, 4)
    ref0 = copy.deepcopy(ref)
    reset_reference(ref, policy, alpha=0.6)
    for r, r0, p in zip(ref.parameters(), ref0.parameters(), policy.parameters()):
        torch.testing.assert_close(r, 0.6 * p + 0.4 * r0, rtol=0, atol=1e-7)
    reset_reference(ref, policy)
    for r, p in zip(ref.parameters(), policy.parameters()):
        assert torch.equal(r, p)
    with pytest.raises(ValueError, match="shape"):
        reset_reference(torch.nn.Linear(4, 5), policy)


# ----------------------------------------------------------------------------- triggers


def _fire(cfg, steps, kl=None, val=None):
    """Run a trigger over a synthetic stream; returns the steps at which it fired."""
    sched = ResetSchedule(cfg)
    fired = []
    for t in range(1, steps + 1):
        if val is not None and t in val:
            sched.observe_validation(val[t])
        sched.observe_step(t, None if kl is None else kl[t - 1])
        if sched.due(t):
            sched.mark_reset(t)
            fired.append(t)
    return fired


def test_periodic_fires_every_k_and_none_never():
    assert _fire(ResetConfig(trigger="periodic", params={"every": 10}), 35) == [10, 20, 30]
    assert _fire(ResetConfig(trigger="polyak", params={"every": 7}), 20) == [7, 14]
    assert _fire(ResetConfig(trigger="none"), 50) == []


def test_kl_spike_absolute_threshold_and_spacing():
    kl = [0.1] * 30
    for t in (5, 6, 7, 20):
        kl[t - 1] = 1.0
    cfg = ResetConfig(trigger="kl_spike", params={"kl_threshold": 0.5})
    assert _fire(cfg, 30, kl) == [5, 6, 7, 20]
    cfg = ResetConfig(trigger="kl_spike", min_spacing=3, params={"kl_threshold": 0.5})
    assert _fire(cfg, 30, kl) == [5, 20]  # 6, 7 are closer than 3 steps to 5


def test_kl_spike_relative_to_running_mean():
    kl = [0.1] * 12 + [0.25] + [0.1] * 5 + [0.45] + [0.1] * 3
    multiple = {"kl_threshold": None, "kl_multiple": 3.0, "kl_warmup": 3}  # no absolute threshold
    cfg = ResetConfig(trigger="kl_spike", params={**multiple, "kl_ema": 0.5})
    assert _fire(cfg, len(kl), kl) == [19]  # 0.25 < 3 x 0.1 does not fire; 0.45 does
    early = [1.0] + [0.1] * 3  # no history yet: the multiple does not apply during warm-up
    assert _fire(ResetConfig(trigger="kl_spike", params=multiple), 4, early) == []


def test_stall_fires_after_patience_evaluations_without_improvement():
    val = {10: 0.2, 20: 0.3, 30: 0.3, 40: 0.29, 50: 0.5, 60: 0.5, 70: 0.6}
    cfg = ResetConfig(trigger="stall", params={"patience": 2})
    assert _fire(cfg, 70, val=val) == [40]  # 30 and 40 did not beat 0.3
    cfg = ResetConfig(trigger="stall", params={"patience": 2, "min_delta": 0.15})
    # with min_delta 0.15: 0.3 is not > 0.2 + 0.15 -> stale at 20, 30 -> reset at 30; after it
    # the baseline restarts at 40 (0.29), 50 improves, 60 and 70 are stale -> reset at 70
    assert _fire(cfg, 70, val=val) == [30, 70]


def test_stall_condition_during_spacing_is_dropped():
    val = {t: 0.1 for t in range(5, 101, 5)}
    cfg = ResetConfig(trigger="stall", min_spacing=12, params={"patience": 1})
    fired = _fire(cfg, 100, val=val)
    assert all(b - a >= 12 for a, b in zip(fired, fired[1:])) and len(fired) >= 3

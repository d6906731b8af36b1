"""Reference resets and optimizer-state transforms, tested as mathematics."""

import copy

import pytest
import torch

from prorl_bench.config import (
    KLControlConfig,
    KLControlKind,
    OptResetConfig,
    ResetConfig,
    StepPolicy,
)
from prorl_bench.rl.kl_control import KLController
from prorl_bench.rl.opt_state import apply_opt_reset, check_adam_state
from prorl_bench.rl.resets import ResetSchedule, reset_reference
from prorl_bench.rl.schedule import LRSchedule

# ----------------------------------------------------------------------------- optimizer transforms


def _model_and_batches(seed=0, n=12):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    xs = [torch.randn(8, 5) for _ in range(n)]
    return model, xs


def _train(model, opt, xs):
    for x in xs:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def _adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def test_hard_reset_continues_bit_identically_to_a_fresh_optimizer():
    model, xs = _model_and_batches()
    opt = _adamw(model)
    _train(model, opt, xs[:6])
    twin = copy.deepcopy(model)
    apply_opt_reset(opt, OptResetConfig(kind="hard", step=StepPolicy.reset))
    _train(model, opt, xs[6:])
    _train(twin, _adamw(twin), xs[6:])  # optimizer newly constructed at the reset step
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_keep_changes_nothing():
    model, xs = _model_and_batches()
    opt = _adamw(model)
    _train(model, opt, xs[:4])
    before = copy.deepcopy(opt.state_dict())
    apply_opt_reset(opt, OptResetConfig(kind="keep"))
    after = opt.state_dict()
    for k, st in before["state"].items():
        for key, val in st.items():
            assert torch.equal(val, after["state"][k][key])


@pytest.mark.parametrize(
    "cfg,fm,fv,step_reset",
    [
        (OptResetConfig(kind="soft", step=StepPolicy.keep, params={"factor": 0.3}), 0.3, 0.3, False),
        (OptResetConfig(kind="soft", step=StepPolicy.reset, params={"factor": 0.3}), 0.3, 0.3, True),
        (OptResetConfig(kind="asym", step=StepPolicy.keep, params={"m_factor": 0.0, "v_factor": 1.0}), 0.0, 1.0, False),
        (
            OptResetConfig(kind="asym", step=StepPolicy.reset, params={"m_factor": 0.5, "v_factor": 0.25}),
            0.5,
            0.25,
            True,
        ),
    ],
)
def test_soft_and_asym_scale_exactly_the_moments_and_handle_step(cfg, fm, fv, step_reset):
    model, xs = _model_and_batches()
    opt = _adamw(model)
    _train(model, opt, xs[:4])
    before = copy.deepcopy(opt.state_dict()["state"])
    info = apply_opt_reset(opt, cfg)
    after = opt.state_dict()["state"]
    for k in before:
        assert torch.equal(after[k]["exp_avg"], before[k]["exp_avg"] * fm)
        assert torch.equal(after[k]["exp_avg_sq"], before[k]["exp_avg_sq"] * fv)
        assert float(after[k]["step"]) == (0.0 if step_reset else float(before[k]["step"]))
    assert info["step_reset"] == step_reset


def test_unknown_state_layouts_fail_loudly():
    model, xs = _model_and_batches()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(TypeError, match="Adam"):
        apply_opt_reset(sgd, OptResetConfig(kind="soft"))
    opt = torch.optim.AdamW(model.parameters(), amsgrad=True)
    with pytest.raises(ValueError, match="amsgrad"):
        check_adam_state(opt)
    opt = _adamw(model)
    _train(model, opt, xs[:1])
    next(iter(opt.state.values()))["extra"] = torch.zeros(1)
    with pytest.raises(ValueError, match="unknown optimizer state layout"):
        apply_opt_reset(opt, OptResetConfig(kind="hard", step=StepPolicy.reset))


def test_adam_bias_correction_hazard_zeroing_moments_but_keeping_step_spikes_the_first_update():
    """m = v = 0 with step = t0 >> 1: bias corrections are ~1 and no longer undo the zero init, so
    the first update is (1 - b1) / sqrt(1 - b2) = 0.1 / 0.0316 = 3.16x the hard reset's (step = 0)."""

    def first_update(step_policy):
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(50))
        opt = torch.optim.Adam([p], lr=1e-3)
        for _ in range(3000):  # t0 >> 1000
            opt.zero_grad()
            p.grad = torch.randn(50)
            opt.step()
        apply_opt_reset(opt, OptResetConfig(kind="soft", step=step_policy, params={"factor": 0.0}))
        before = p.detach().clone()
        p.grad = torch.full((50,), 0.5)
        opt.step()
        return float((p.detach() - before).abs().mean())

    keep, reset = first_update(StepPolicy.keep), first_update(StepPolicy.reset)
    assert reset == pytest.approx(1e-3, rel=1e-3)  # a fresh Adam's first step is lr * sign(g)
    t = 3001  # bias corrections at the kept step: 1 - b^t
    expected = (0.1 / (1 - 0.9**t)) / (0.001 / (1 - 0.999**t)) ** 0.5
    assert keep / reset == pytest.approx(expected, rel=1e-3)
    assert keep / reset > 3.0  # ~3x: the "reset" made the next step three times larger


def test_lr_schedule_restart_and_rewarmup():
    s = LRSchedule(1.0, warmup=4)
    assert [s.lr(t) for t in (1, 2, 4, 9)] == [0.25, 0.5, 1.0, 1.0]
    s.restart(11, 2)
    assert [s.lr(t) for t in (11, 12, 13)] == [0.5, 1.0, 1.0]


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
    cfg = ResetConfig(trigger="kl_spike", params={"kl_multiple": 3.0, "kl_ema": 0.5, "kl_warmup": 3})
    assert _fire(cfg, len(kl), kl) == [19]  # 0.25 < 3 x 0.1 does not fire; 0.45 does
    early = [1.0] + [0.1] * 3  # no history yet: the multiple does not apply during warm-up
    assert _fire(ResetConfig(trigger="kl_spike", params={"kl_multiple": 3.0, "kl_warmup": 3}), 4, early) == []


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


def test_adaptive_kl_controller_direction_and_bounds():
    cfg = KLControlConfig(kind=KLControlKind.adaptive, target=0.1, horizon=10, beta_min=0.01, beta_max=0.2)
    ctl = KLController(0.05, cfg)
    ctl.update(0.5)
    assert ctl.value == pytest.approx(0.05 * 1.02)  # error clipped at +20%, / horizon
    for _ in range(500):
        ctl.update(0.5)
    assert ctl.value == 0.2  # upper bound
    for _ in range(1000):
        ctl.update(0.0)
    assert ctl.value == 0.01  # lower bound
    v = ctl.value
    ctl.update(float("nan"))
    assert ctl.value == v
    ctl.update(0.1)  # on target: no change
    assert ctl.value == v
    ctl.restore()
    assert ctl.value == 0.05
    fixed = KLController(0.05, KLControlConfig(kind=KLControlKind.fixed))
    fixed.update(10.0)
    assert fixed.value == 0.05

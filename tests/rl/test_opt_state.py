"""Optimizer-state transforms at a reset (rl/opt_state.py), tested as mathematics: hard = a fresh
optimizer, keep, soft/asym scale the moments exactly, unknown layouts fail, the step-counter hazard."""

import copy

import pytest
import torch

from prorl_bench.config import OptResetConfig, StepPolicy
from prorl_bench.rl.opt_state import apply_opt_reset, check_adam_state


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

"""Loss variants TRL / verl users expect, each against a closed form: Dr. GRPO advantages, the
dual-clip PPO loss, and verl's seq-mean-token-sum(-norm) aggregations."""

from __future__ import annotations

import pytest
import torch

from prorl_bench.config import ConfigError, LossAgg
from prorl_bench.rl.advantages import compute_advantages
from prorl_bench.rl.losses import aggregate, clipped_surrogate
from tests.conftest import make_config


def test_dr_grpo_is_the_group_centred_reward_without_std_scaling():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 1.0, 0.0]])
    adv = compute_advantages("dr_grpo", rewards)
    expected = torch.tensor([[0.75, -0.25, -0.25, -0.25], [0.0, 0.0, 0.5, -0.5]])
    assert torch.allclose(adv, expected, atol=0, rtol=0)
    # GRPO divides by the group std: the two estimators differ by exactly that factor
    grpo = compute_advantages("grpo", rewards, eps=0.0)
    assert torch.allclose(grpo * rewards.std(dim=1, keepdim=True), adv, atol=1e-6)


@pytest.mark.parametrize(
    "ratio,adv,expected,clipped",
    [
        (5.0, -1.0, 3.0, True),  # r > c: the loss -rA = 5 is capped at c|A| = 3
        (2.0, -1.0, 2.0, False),  # 1 - eps_low < r < c: untouched, -rA
        (0.5, -1.0, 0.8, True),  # ordinary clip: max(-rA, -clip(r)A) = 0.8
        (5.0, 1.0, -1.28, True),  # A > 0: dual clip does not apply (clip-higher at 1.28)
        (4.0, -2.0, 6.0, True),  # c|A| = 6 < 8
    ],
)
def test_dual_clip_matches_verl_closed_form(ratio, adv, expected, clipped):
    logp = torch.log(torch.tensor([ratio]))
    loss, was_clipped = clipped_surrogate(logp, torch.zeros(1), torch.tensor([adv]), 0.2, 0.28, clip_ratio_c=3.0)
    assert float(loss) == pytest.approx(expected, abs=1e-6) and bool(was_clipped) == clipped
    # verl: where(A < 0, min(-A*c, max(-A*r, -A*clip(r))), max(-A*r, -A*clip(r)))
    r, a = torch.tensor(ratio), torch.tensor(adv)
    base = torch.maximum(-a * r, -a * r.clamp(0.8, 1.28))
    verl = torch.where(a < 0, torch.minimum(-a * 3.0, base), base)
    assert float(loss) == pytest.approx(float(verl), abs=1e-6)


def test_dual_clip_removes_the_gradient_beyond_c_only():
    logp = torch.log(torch.tensor([[5.0], [2.0]])).requires_grad_(True)  # (B=2, L=1)
    loss, _ = clipped_surrogate(logp, torch.zeros(2, 1), torch.tensor([-1.0, -1.0]), 0.2, 0.28, clip_ratio_c=3.0)
    loss.sum().backward()
    assert logp.grad[0, 0] == 0 and logp.grad[1, 0] == pytest.approx(2.0)  # d(-rA)/dlogp = -A r = 2


def test_sum_aggregations_match_verl():
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 0.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    assert float(aggregate(values, mask, LossAgg.seq_mean_token_sum)) == (10.0 + 4.0) / 2
    assert float(aggregate(values, mask, LossAgg.seq_mean_token_sum_norm)) == (10.0 + 4.0) / (2 * 4)


def test_clip_ratio_c_must_exceed_one_and_dr_grpo_preset_composes():
    with pytest.raises(ConfigError, match="algo.clip_ratio_c"):
        make_config(["algo.clip_ratio_c=1.0"])
    cfg = make_config(["algo=dr_grpo"])
    assert cfg.algo.advantage == "dr_grpo" and cfg.algo.loss_agg == LossAgg.seq_mean_token_sum_norm


@pytest.mark.parametrize("knobs", [["algo=dr_grpo"], ["algo.clip_ratio_c=3.0"], ["algo.loss_agg=seq_mean_token_sum"]])
def test_loss_variants_train(run_exp, knobs):
    summary, _ = run_exp(knobs, name="v")
    assert summary["status"] == "completed" and summary["steps_completed"] == 6
    assert 0.0 <= summary["success_rate/last10"] <= 1.0

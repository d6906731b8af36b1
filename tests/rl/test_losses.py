"""Clipped surrogate with clip-higher, and token vs sequence aggregation."""

import pytest
import torch

from prorl_bench.config import LossAgg
from prorl_bench.rl.losses import aggregate, clipped_surrogate


def _loss(ratio, adv, lo=0.2, hi=0.4):
    logp = torch.log(torch.tensor([ratio], requires_grad=True))
    loss, clipped = clipped_surrogate(logp, torch.zeros(1), torch.tensor([adv]), lo, hi)
    return float(loss.detach()), bool(clipped)


def test_clip_higher_is_asymmetric():
    # positive advantage: the ratio is capped at 1 + eps_high (0.4), not 1 + eps_low
    loss, clipped = _loss(1.3, 1.0)
    assert abs(loss + 1.3) < 1e-6 and not clipped  # inside [1-0.2, 1+0.4]: a symmetric 0.2 clip would cut it
    loss, clipped = _loss(1.6, 1.0)
    assert abs(loss + 1.4) < 1e-6 and clipped
    # negative advantage: the ratio is floored at 1 - eps_low (0.2)
    loss, clipped = _loss(0.7, -1.0)
    assert abs(loss - 0.8) < 1e-6 and clipped
    loss, clipped = _loss(0.9, -1.0)
    assert abs(loss - 0.9) < 1e-6 and not clipped


def test_clipped_tokens_have_zero_gradient():
    logp = torch.log(torch.tensor([1.6, 1.1])).requires_grad_(True)
    loss, _ = clipped_surrogate(logp, torch.zeros(2), torch.tensor([1.0, 1.0]), 0.2, 0.4)
    loss.sum().backward()
    assert logp.grad[0] == 0 and logp.grad[1] != 0


def test_token_vs_sequence_aggregation():
    values = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    assert abs(float(aggregate(values, mask, LossAgg.token)) - 8 / 5) < 1e-6
    assert float(aggregate(values, mask, LossAgg.sequence)) == (1.0 + 4.0) / 2


def _padded(values: torch.Tensor, mask: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same batch padded with masked-out garbage columns up to ``width`` tokens."""
    extra = width - values.shape[1]
    return torch.cat([values, torch.full((values.shape[0], extra), 7.0)], 1), torch.cat(
        [mask, torch.zeros(mask.shape[0], extra)], 1
    )


def test_seq_mean_token_sum_norm_divides_by_the_fixed_budget_not_the_padded_width():
    """Dr. GRPO's normaliser is the completion budget (TRL: max_completion_length): a batch trimmed
    to 4 tokens (CPU) and the same batch padded to 8 (CUDA's every-8-tokens stop check) must give
    the same loss and the same gradient; closed form sum(values * mask) / (B * budget)."""
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 0.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    budget = 10
    trimmed = aggregate(values, mask, LossAgg.seq_mean_token_sum_norm, norm_len=budget)
    wide_v, wide_m = _padded(values, mask, 8)
    wide = aggregate(wide_v, wide_m, LossAgg.seq_mean_token_sum_norm, norm_len=budget)
    assert (
        float(trimmed.detach()) == float(wide.detach()) == pytest.approx((1 + 2 + 3 + 4 + 4) / (2 * budget), rel=1e-7)
    )
    (g_trimmed,) = torch.autograd.grad(trimmed, values)
    (g_wide,) = torch.autograd.grad(wide, values)
    assert torch.equal(g_trimmed, g_wide) and torch.equal(g_trimmed, mask / (2 * budget))
    # without the fixed budget (verl's form) the loss scale follows the padded width: the bug it fixes
    assert float(aggregate(values.detach(), mask, LossAgg.seq_mean_token_sum_norm)) == pytest.approx(
        14 / (2 * 4), rel=1e-7
    )
    assert float(aggregate(wide_v.detach(), wide_m, LossAgg.seq_mean_token_sum_norm)) == pytest.approx(
        14 / (2 * 8), rel=1e-7
    )
    with pytest.raises(ValueError, match="shorter than the batch"):
        aggregate(wide_v, wide_m, LossAgg.seq_mean_token_sum_norm, norm_len=6)


@pytest.mark.parametrize("budget", [None, 9])
def test_trainer_normalises_dr_grpo_by_the_completion_budget(run_exp, monkeypatch, budget):
    """Every loss aggregation of a seq_mean_token_sum_norm run uses the completion budget: the task's
    (reverse_digits, max_len 5: 5 digits + EOS) or algo.max_new_tokens when set."""
    from prorl_bench.run import phases

    seen = []
    real = phases.aggregate

    def spy(values, mask, mode, norm_len=None):
        if LossAgg(mode) == LossAgg.seq_mean_token_sum_norm:
            seen.append((norm_len, mask.shape[1]))
        return real(values, mask, mode, norm_len)

    monkeypatch.setattr(phases, "aggregate", spy)
    extra = [] if budget is None else [f"algo.max_new_tokens={budget}"]
    run_exp(["algo=dr_grpo", "steps=2", "eval_every=2", *extra], f"dr_{budget}")
    want = 6 if budget is None else budget
    assert seen and all(n == want and width <= want for n, width in seen)

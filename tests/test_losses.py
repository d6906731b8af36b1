"""Clipped surrogate with clip-higher, and token vs sequence aggregation."""

import torch

from prorl_bench.config import LossAgg
from prorl_bench.losses import aggregate, clipped_surrogate


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

"""Clipped surrogate with clip-higher, and loss aggregation. Shapes: (B, L) per token."""

from __future__ import annotations

import torch

from prorl_bench.config import LossAgg


def clipped_surrogate(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    eps_low: float,
    eps_high: float,
    log_ratio_clamp: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss -min(r A, clip(r, 1-eps_low, 1+eps_high) A), r = exp(logp - logp_old).

    adv: (B,) per sequence or (B, L) per token. Returns (loss (B, L), clipped (B, L) bool), where
    ``clipped`` marks tokens whose gradient the clip removed.
    """
    if adv.dim() == 1:
        adv = adv[:, None]
    ratio = torch.exp((logp - logp_old).clamp(-log_ratio_clamp, log_ratio_clamp))
    unclipped = ratio * adv
    clipped_obj = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    loss = -torch.minimum(unclipped, clipped_obj)
    clipped = clipped_obj < unclipped
    return loss, clipped


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: LossAgg) -> torch.Tensor:
    """Reduce per-token values (B, L) over response tokens (mask 1) to a scalar.

    token:    sum(values * mask) / sum(mask)                 (every token weighs the same; DAPO)
    sequence: mean_b [ sum_t(values * mask) / len_b ]        (every sequence weighs the same; GRPO)
    """
    mask = mask.to(values.dtype)
    if LossAgg(mode) == LossAgg.token:
        return (values * mask).sum() / mask.sum().clamp_min(1.0)
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
    return per_seq.mean()

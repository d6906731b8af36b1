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
    clip_ratio_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss -min(r A, clip(r, 1-eps_low, 1+eps_high) A), r = exp(logp - logp_old).

    adv: (B,) per sequence or (B, L) per token. Returns (loss (B, L), clipped (B, L) bool), where
    ``clipped`` marks tokens whose gradient the clip removed.

    ``clip_ratio_c`` (dual clip, as verl's ``compute_policy_loss``): where A < 0 the loss is
    additionally capped, min(loss, -clip_ratio_c * A), so its value is bounded by c * |A| and a
    token with r > c gets no gradient (it counts as clipped).
    """
    if adv.dim() == 1:
        adv = adv[:, None]
    ratio = torch.exp((logp - logp_old).clamp(-log_ratio_clamp, log_ratio_clamp))
    unclipped = ratio * adv
    clipped_obj = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    loss = -torch.minimum(unclipped, clipped_obj)
    clipped = clipped_obj < unclipped
    if clip_ratio_c is not None:
        cap = -clip_ratio_c * adv  # > 0 where A < 0
        dual = (adv < 0) & (cap < loss)
        loss = torch.where(dual, cap.expand_as(loss), loss)
        clipped = clipped | dual
    return loss, clipped


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: LossAgg, norm_len: int | None = None) -> torch.Tensor:
    """Reduce per-token values (B, L) over response tokens (mask 1) to a scalar.

    token:    sum(values * mask) / sum(mask)                 (every token weighs the same; DAPO)
    sequence: mean_b [ sum_t(values * mask) / len_b ]        (every sequence weighs the same; GRPO)
    seq_mean_token_sum:      mean_b [ sum_t(values * mask) ]     (verl; longer sequences weigh more)
    seq_mean_token_sum_norm: sum(values * mask) / (B * norm_len)  (Dr. GRPO: a length-free constant)

    ``norm_len`` (tokens) is seq_mean_token_sum_norm's fixed normaliser: the completion budget
    (``algo.max_new_tokens`` or the task's), as TRL's Dr. GRPO divides by ``max_completion_length``.
    The batch's padded width L would change from step to step and between devices (a CPU rollout is
    trimmed to its longest completion, a CUDA one to a multiple of 8 tokens), so the same run would
    have a different loss scale on each; it is used only when no ``norm_len`` is given (verl's form).
    """
    mask = mask.to(values.dtype)
    mode = LossAgg(mode)
    if mode == LossAgg.token:
        return (values * mask).sum() / mask.sum().clamp_min(1.0)
    if mode == LossAgg.seq_mean_token_sum:
        return (values * mask).sum(-1).mean()
    if mode == LossAgg.seq_mean_token_sum_norm:
        width = mask.shape[-1] if norm_len is None else norm_len
        if width < mask.shape[-1]:
            raise ValueError(f"seq_mean_token_sum_norm: norm_len {width} is shorter than the batch's {mask.shape[-1]}")
        return (values * mask).sum() / (mask.shape[0] * width)
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
    return per_seq.mean()


def diagnostic_agg(mode: LossAgg) -> LossAgg:
    """The mean used for logged per-token diagnostics (clip fraction, KL): a loss aggregation
    that sums tokens would turn a fraction into a count, so sum modes log per-sequence means."""
    mode = LossAgg(mode)
    return mode if mode in (LossAgg.token, LossAgg.sequence) else LossAgg.sequence

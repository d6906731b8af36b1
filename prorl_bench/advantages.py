"""Advantage estimators on outcome rewards. Input rewards: (N prompts, G samples) float.

All return advantages of the same shape, one scalar per sequence (broadcast over its tokens).
Standard deviations are the unbiased (n-1) estimates, as torch.std, TRL and verl use.
"""

from __future__ import annotations

import torch

from prorl_bench.config import AdvantageName


def grpo(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Group z-score: (R - mean_g) / (std_g + eps)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


def rloo(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Leave-one-out baseline: R_i - mean_{j != i} R_j. (eps unused; kept for a uniform signature.)"""
    g = rewards.shape[1]
    total = rewards.sum(dim=1, keepdim=True)
    return rewards - (total - rewards) / (g - 1)


def reinforce_pp_baseline(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """ProRL v2 / REINFORCE++-baseline: R~ = R - mean_g(R); A = (R~ - mean_batch R~) / std_batch R~."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return (centred - centred.mean()) / (centred.std() + eps)


def dr_grpo(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): R - mean_g(R).

    No division by the group std, which up-weights groups that are nearly all right or all
    wrong (a question-difficulty bias). (eps unused; kept for a uniform signature.) Pair it with
    ``loss_agg=seq_mean_token_sum_norm`` to also drop the per-sequence length normalisation.
    """
    return rewards - rewards.mean(dim=1, keepdim=True)


_ESTIMATORS = {
    AdvantageName.grpo: grpo,
    AdvantageName.rloo: rloo,
    AdvantageName.reinforce_pp_baseline: reinforce_pp_baseline,
    AdvantageName.dr_grpo: dr_grpo,
}


def compute_advantages(name: AdvantageName, rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (prompts, group>=2), got shape {tuple(rewards.shape)}")
    return _ESTIMATORS[AdvantageName(name)](rewards, eps)


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """Dynamic sampling (DAPO): True for groups whose rewards are not all equal. (N,) bool."""
    return (rewards != rewards[:, :1]).any(dim=1)

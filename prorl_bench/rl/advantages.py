"""Advantage estimators on outcome rewards. Input rewards: (N prompts, G samples) float.

All return advantages of the same shape, one scalar per sequence (broadcast over its tokens).
Standard deviations are the unbiased (n-1) estimates, as torch.std, TRL and verl use.

The built-in estimators are declared (description, ``centres_per_group``) in
``config/builtin_options.py`` and registered here with their code. Adding an estimator: a function
``(rewards (N, G), eps) -> advantages (N, G)`` decorated with ``@ADVANTAGES.register("name")`` (here or
in a plugin module, docs/extending.md); ``algo.advantage=name`` then selects it. Metadata it may
declare: ``centres_per_group=False`` when its advantages are not centred within each group (an
all-equal group then keeps what the estimator gives it, instead of exactly 0; e.g. batch whitening);
``params=MyParams`` (a dataclass whose fields are flat keys of the ``algo`` section, ``algo.clip``),
passed as ``params=``. A run binds the estimator once (``advantage_estimator``) and every path that
computes advantages (routing's split path too) calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from prorl_bench.registry import ADVANTAGES


@ADVANTAGES.register("grpo")
def grpo(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Group z-score: (R - mean_g) / (std_g + eps)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


@ADVANTAGES.register("rloo")
def rloo(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Leave-one-out baseline: R_i - mean_{j != i} R_j. (eps unused; kept for a uniform signature.)"""
    g = rewards.shape[1]
    total = rewards.sum(dim=1, keepdim=True)
    return rewards - (total - rewards) / (g - 1)


@ADVANTAGES.register("reinforce_pp_baseline")
def reinforce_pp_baseline(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """ProRL v2 / REINFORCE++-baseline: R~ = R - mean_g(R); A = (R~ - mean_batch R~) / std_batch R~."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return (centred - centred.mean()) / (centred.std() + eps)


@ADVANTAGES.register("dr_grpo")
def dr_grpo(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): R - mean_g(R).

    No division by the group std, which up-weights groups that are nearly all right or all
    wrong (a question-difficulty bias). (eps unused; kept for a uniform signature.) Pair it with
    ``loss_agg=seq_mean_token_sum_norm`` to also drop the per-sequence length normalisation.
    """
    return rewards - rewards.mean(dim=1, keepdim=True)


AdvantageFn = Callable[[torch.Tensor], torch.Tensor]  # rewards (N, G) -> advantages (N, G)


def advantage_estimator(name: str, params: Any = None, eps: float = 1e-6) -> AdvantageFn:
    """Estimator ``name`` with its parameters (``algo.<param>``: the checked instance, or a mapping
    checked here, once) and ``eps`` bound: ``rewards (N, G) -> advantages (N, G)``, a group whose
    rewards are all equal getting exactly 0 (estimators centred per group).

    In float32 a group whose rewards are all equal but not exactly representable (0.6, 1/3, partial
    credit) gets mean != each reward by rounding, so after the std division |A| reaches ~0.06 with
    one sign for the whole group — a push with no signal behind it (verl shares this). Such groups
    carry no information, so their advantages are set to exactly 0. Other groups are untouched
    (binary rewards were already exact: trajectories are unchanged). REINFORCE++-baseline whitens
    over the batch, which moves flat groups by design; it is left as defined (registered with
    ``centres_per_group=False``).
    """
    fn = ADVANTAGES.build(name, params)
    centred = fn.meta.get("centres_per_group", True)

    def advantages(rewards: torch.Tensor) -> torch.Tensor:
        if rewards.dim() != 2 or rewards.shape[1] < 2:
            raise ValueError(f"rewards must be (prompts, group>=2), got shape {tuple(rewards.shape)}")
        adv = fn(rewards, eps)
        return adv.masked_fill(~informative_groups(rewards)[:, None], 0.0) if centred else adv

    return advantages


def compute_advantages(name: str, rewards: torch.Tensor, eps: float = 1e-6, params: Any = None) -> torch.Tensor:
    """Advantages (N, G) of ``rewards`` by estimator ``name`` (a one-off: a run binds its estimator
    once with ``advantage_estimator``)."""
    return advantage_estimator(name, params, eps)(rewards)


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """Dynamic sampling (DAPO): True for groups whose rewards are not all equal. (N,) bool."""
    return (rewards != rewards[:, :1]).any(dim=1)

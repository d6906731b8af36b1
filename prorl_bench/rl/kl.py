"""Per-token KL estimators (Schulman, "Approximating KL Divergence", 2020).

Tokens are sampled from pi_theta. With l = logp_theta - logp_ref and r = exp(-l) = pi_ref/pi_theta:

* k1 = l                 unbiased for KL(theta||ref); as a *loss* its expected gradient is 0,
                         so it is only meaningful folded into the reward.
* k2 = 1/2 l^2           biased value, low variance; its on-policy gradient equals grad KL(theta||ref).
* k3 = (r - 1) - log r   unbiased and >= 0 ("low_var_kl" of GRPO/TRL/verl); as a loss its gradient
                         is the forward-KL gradient (biased for the reverse KL).

Clamps, k3 only (as verl's ``kl_penalty``: it clamps ``low_var_kl`` and nothing else): the
log-ratio to +-``log_ratio_clamp`` (20) before the exp, and the per-token value to +-``kl_clamp``
(10). k1 and k2 take no exp and are left unclamped, so their gradient never vanishes: an earlier
value clamp on every estimator silently removed the KL gradient exactly on the tokens that drifted
furthest (k2 for |l| > 4.47). For k3 the clamp is kept because its gradient 1 - exp(-l) explodes
for l << 0; its price, stated: no KL gradient where k3 > 10, i.e. l < -2.61 or l > 11 (tested).

Adding an estimator: ``@KL_ESTIMATORS.register("name", reward_only=..., clamped=...)`` on a function
``(logp, logp_ref, log_ratio_clamp) -> per-token values``; ``reward_only=True`` forbids it as a loss
term (config error), ``clamped=True`` clamps its value to +-kl_clamp, ``params=MyParams`` (a
dataclass) takes ``kl_estimator.params`` (passed as ``params=``), and ``reward_form=fn(k, logp_ref,
logp_old)`` may give the per-token penalty folded into the reward its own form (k2: the ProRL v2
``ref_over_old`` formula when ``kl_estimator.k2_mode`` asks for it; None = the estimator itself).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from prorl_bench.registry import KL_ESTIMATORS


def log_ratio(logp: torch.Tensor, logp_ref: torch.Tensor, clamp: float = 20.0) -> torch.Tensor:
    return (logp - logp_ref).clamp(-clamp, clamp)


@KL_ESTIMATORS.register("k1", reward_only=True, clamped=False)
def k1(logp: torch.Tensor, logp_ref: torch.Tensor, clamp: float = 20.0) -> torch.Tensor:
    """``clamp`` unused (no exp): the gradient is 1 everywhere."""
    return logp - logp_ref


def _k2_reward_form(k: Any, logp_ref: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor | None:
    """``kl_estimator.k2_mode=ref_over_old``: the ProRL v2 blog formula as the reward penalty."""
    return k2_ref_over_old(logp_ref, logp_old) if k.k2_mode == "ref_over_old" else None


@KL_ESTIMATORS.register("k2", reward_only=False, clamped=False, reward_form=_k2_reward_form)
def k2(logp: torch.Tensor, logp_ref: torch.Tensor, clamp: float = 20.0) -> torch.Tensor:
    """``clamp`` unused (no exp): the gradient is l everywhere."""
    return 0.5 * (logp - logp_ref).square()


@KL_ESTIMATORS.register("k3", reward_only=False, clamped=True)
def k3(logp: torch.Tensor, logp_ref: torch.Tensor, clamp: float = 20.0) -> torch.Tensor:
    neg = -log_ratio(logp, logp_ref, clamp)  # log r
    return torch.expm1(neg) - neg


def kl_per_token(
    name: str,
    logp: torch.Tensor,
    logp_ref: torch.Tensor,
    log_ratio_clamp: float = 20.0,
    kl_clamp: float = 10.0,
    params: Any = None,
) -> torch.Tensor:
    """Per-token estimate of KL(theta||ref), same shape as the inputs; k3 is clamped to +-kl_clamp.
    ``params``: the estimator's parameters (``kl_estimator.params``), for estimators that declare them."""
    if params is None or isinstance(params, Mapping):
        params = KL_ESTIMATORS.params(name, params, "kl_estimator.params")
    fn = KL_ESTIMATORS[name]
    value = (
        fn(logp, logp_ref, log_ratio_clamp) if params is None else fn(logp, logp_ref, log_ratio_clamp, params=params)
    )
    return value.clamp(-kl_clamp, kl_clamp) if KL_ESTIMATORS.meta(name).get("clamped") else value


def kl_tokens(k: Any, logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """The configured estimator (the ``kl_estimator`` group ``k``: name, clamps, params) per token."""
    return kl_per_token(k.name, logp, logp_ref, k.log_ratio_clamp, k.kl_clamp, k.params)


def reward_kl_tokens(k: Any, logp_old: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token KL penalty folded into the reward (``kl_estimator.placement=reward``): the
    estimator's own ``reward_form`` if it registered one and it applies, else the estimator."""
    form = KL_ESTIMATORS.meta(k.name).get("reward_form")
    value = None if form is None else form(k, logp_ref, logp_old)
    return kl_tokens(k, logp_old, logp_ref) if value is None else value


@torch.no_grad()
def k2_ref_over_old(logp_ref: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor:
    """ProRL v2 blog formula: x = exp(clamp(log pi_ref/pi_old, -10, 10)); 1/2 (log x)^2.

    It has no gradient w.r.t. theta (both inputs are fixed per rollout), so it is a diagnostic or
    a reward-side penalty only; the result is detached by construction.
    """
    x = torch.exp((logp_ref - logp_old).clamp(-10.0, 10.0))
    return 0.5 * torch.log(x).square()

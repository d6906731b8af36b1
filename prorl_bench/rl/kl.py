"""Per-token KL estimators (Schulman, "Approximating KL Divergence", 2020).

Tokens are sampled from pi_theta. With l = logp_theta - logp_ref and r = exp(-l) = pi_ref/pi_theta:

* k1 = l                 unbiased for KL(theta||ref); as a *loss* its expected gradient is 0,
                         so it is only meaningful folded into the reward.
* k2 = 1/2 l^2           biased value, low variance; its on-policy gradient equals grad KL(theta||ref).
* k3 = (r - 1) - log r   unbiased and >= 0 ("low_var_kl" of GRPO/TRL/verl); as a loss its gradient
                         is the forward-KL gradient (biased for the reverse KL).
* w * k3, w = pi_theta/pi_old (``kl_estimator.importance_weight=true``, k3 in the loss only): TRL's
                         ``use_bias_correction_kl`` (its default since 0.2x), OpenRLHF's off-policy KL,
                         DeepSeek-V3.2 (arXiv 2512.02556). Tokens are drawn from pi_old, so
                         E_old[w k3] = KL(theta||ref) exactly, and because w is *not* detached its gradient
                         is the reverse-KL gradient -- also on-policy, where w = 1 but grad w != 0
                         (tests/rl/test_kl.py checks both by enumerating a vocabulary).

Clamps, k3 only (as verl's ``kl_penalty``: it clamps ``low_var_kl`` and nothing else): the
log-ratio to +-``log_ratio_clamp`` (20) before the exp, and the per-token value to +-``kl_clamp``
(10). k1 and k2 take no exp and are left unclamped, so their gradient never vanishes: an earlier
value clamp on every estimator silently removed the KL gradient exactly on the tokens that drifted
furthest (k2 for |l| > 4.47). For k3 the clamp is kept because its gradient 1 - exp(-l) explodes
for l << 0; its price, stated: no KL gradient where k3 > 10, i.e. l < -2.61 or l > 11 (tested).

The built-in estimators are declared (description, parameters, ``reward_only``, ``clamped``, their
config checks) in ``config/builtin_options.py`` and registered here with their code. Adding an
estimator: ``@KL_ESTIMATORS.register("name", reward_only=..., clamped=...)`` on a function
``(logp, logp_ref, log_ratio_clamp) -> per-token values``; ``reward_only=True`` forbids it as a loss
term (config error), ``clamped=True`` clamps its value to +-kl_clamp, ``params=MyParams`` (a
dataclass whose fields are flat keys of the ``kl_estimator`` section) is passed as ``params=``, and
``reward_form=fn(params, logp_ref, logp_old)`` may give the per-token penalty folded into the reward
its own form (k2: the ProRL v2 ``ref_over_old`` formula when ``kl_estimator.k2_mode`` asks for it;
None = the estimator itself). Every KL the bench computes goes through one ``KLEstimator`` (the
run's configured one from ``build_kl``, and the fixed diagnostics of ``run/kl_measure.py``), bound
once: nothing is looked up or checked per call.
"""

from __future__ import annotations

from typing import Any

import torch

from prorl_bench.config.builtin_options import K2Params, K3Params
from prorl_bench.config.enums import K2Mode
from prorl_bench.registry import KL_ESTIMATORS


def log_ratio(logp: torch.Tensor, logp_ref: torch.Tensor, clamp: float = 20.0) -> torch.Tensor:
    return (logp - logp_ref).clamp(-clamp, clamp)


@KL_ESTIMATORS.register("k1")
def k1(logp: torch.Tensor, logp_ref: torch.Tensor, clamp: float = 20.0) -> torch.Tensor:
    """l = logp - logp_ref, not clamped (no exp): the gradient is 1 everywhere. (``clamp``: the
    estimators' uniform signature.)"""
    return logp - logp_ref


def _k2_reward_form(params: K2Params, logp_ref: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor | None:
    """``kl_estimator.k2_mode=ref_over_old``: the ProRL v2 blog formula as the reward penalty."""
    return k2_ref_over_old(logp_ref, logp_old) if params.k2_mode == K2Mode.ref_over_old else None


@KL_ESTIMATORS.register("k2", reward_form=_k2_reward_form)
def k2(logp: torch.Tensor, logp_ref: torch.Tensor, clamp: float = 20.0, params: K2Params | None = None) -> torch.Tensor:
    """``clamp`` unused (no exp): the gradient is l everywhere. ``params.k2_mode`` only changes the
    reward-side penalty (``_k2_reward_form``)."""
    return 0.5 * (logp - logp_ref).square()


@KL_ESTIMATORS.register("k3")
def k3(logp: torch.Tensor, logp_ref: torch.Tensor, clamp: float = 20.0, params: K3Params | None = None) -> torch.Tensor:
    """``params.importance_weight`` is applied by ``KLEstimator`` (it needs pi_old's log-probs), after
    the value clamp: the clamp bounds k3, the weight is the sampling correction."""
    neg = -log_ratio(logp, logp_ref, clamp)  # log r
    return torch.expm1(neg) - neg


class KLEstimator:
    """One estimator with its parameters and clamps bound (``build_kl``: once per run). Called as
    ``kl(logp, logp_ref)`` -> per-token values (same shape); ``kl.reward(logp_old, logp_ref)`` is the
    per-token penalty folded into the reward (``kl_estimator.placement=reward``)."""

    def __init__(self, name: str, params: Any = None, log_ratio_clamp: float = 20.0, kl_clamp: float = 10.0) -> None:
        self.fn = KL_ESTIMATORS.build(name, params)  # a mapping is checked here, once; an instance is kept
        self.name = name
        self.log_ratio_clamp = log_ratio_clamp
        self.kl_clamp = kl_clamp if self.fn.meta.get("clamped") else None
        self._reward_form = self.fn.meta.get("reward_form")
        self.importance_weighted = bool(getattr(self.fn.params, "importance_weight", False))

    def __call__(
        self, logp: torch.Tensor, logp_ref: torch.Tensor, logp_old: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Per-token values; ``logp_old``: the log-probs of the policy that sampled the tokens, required
        by an importance-weighted estimator (value x exp(logp - logp_old), the log-ratio clamped to
        +-log_ratio_clamp as the surrogate's) and ignored otherwise."""
        value = self.fn(logp, logp_ref, self.log_ratio_clamp)
        value = value if self.kl_clamp is None else value.clamp(-self.kl_clamp, self.kl_clamp)
        if not self.importance_weighted:
            return value
        if logp_old is None:
            raise ValueError(
                f"KL estimator {self.name} with importance_weight=true needs the sampling policy's log-probs "
                "(logp_old): without them the weight pi_theta/pi_old cannot be formed"
            )
        return value * torch.exp(log_ratio(logp, logp_old, self.log_ratio_clamp))

    def reward(self, logp_old: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
        """The estimator's own ``reward_form`` if it registered one and it applies, else the estimator
        (taken at pi_old, which sampled the tokens: an importance weight is 1 there)."""
        value = None if self._reward_form is None else self._reward_form(self.fn.params, logp_ref, logp_old)
        return self(logp_old, logp_ref, logp_old) if value is None else value


def build_kl(k: Any) -> KLEstimator:
    """The configured estimator (the ``kl_estimator`` group ``k``: name, clamps, params) bound once."""
    return KLEstimator(k.name, k.params, k.log_ratio_clamp, k.kl_clamp)


@torch.no_grad()
def k2_ref_over_old(logp_ref: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor:
    """ProRL v2 blog formula: x = exp(clamp(log pi_ref/pi_old, -10, 10)); 1/2 (log x)^2.

    It has no gradient w.r.t. theta (both inputs are fixed per rollout), so it is a diagnostic or
    a reward-side penalty only; the result is detached by construction.
    """
    x = torch.exp((logp_ref - logp_old).clamp(-10.0, 10.0))
    return 0.5 * torch.log(x).square()

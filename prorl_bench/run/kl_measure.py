"""One helper for every KL the run measures (not the loss's KL term, which ``phases`` builds with
the estimator's gradient): a per-token estimate between two log-prob tensors, aggregated over the
completion tokens. Used for kl/ref and its variants, kl/old, kl/base and a reset's before/after KL.
Every value comes from a bound ``rl.kl.KLEstimator``: the run's (``ctx.kl``) or a named one, built
once per process (``named_kl``).

``reference_kl`` is the step's KL to the reference — the signal a ``kl_spike`` trigger and the KL
controller read — and every engine computes it with this one function from the behaviour policy's
and the reference's log-probs of the sampled tokens (native: ``diagnostics.step_kl``; TRL: the
log-probs its loss already has, ``engines/trl/rundir.py``)."""

from __future__ import annotations

import functools
from typing import Any

import torch

from prorl_bench.config import K2Mode, LossAgg
from prorl_bench.rl.kl import K2Params, KLEstimator
from prorl_bench.rl.losses import aggregate, diagnostic_agg
from prorl_bench.run.step_signals import KLStats

K2_REF_OVER_OLD = "k2_ref_over_old"  # the ProRL v2 blog formula (a diagnostic, no gradient): k2's reward form


@functools.cache
def named_kl(name: str) -> KLEstimator:
    """The registered estimator ``name`` with its default parameters and clamps, bound once (kl/old and a
    reset's before/after KL use k3, kl/ref_k1 k1). ``K2_REF_OVER_OLD`` is k2 with
    ``k2_mode=ref_over_old``, whose reward form (``KLEstimator.reward``) is that formula."""
    if name == K2_REF_OVER_OLD:
        return KLEstimator("k2", K2Params(k2_mode=K2Mode.ref_over_old))
    return KLEstimator(name)


def mean_kl(
    estimator: Any, logp: torch.Tensor, logp_other: torch.Tensor, mask: torch.Tensor, agg: LossAgg
) -> torch.Tensor:
    """KL(pi || other) per token, aggregated by ``agg`` over ``mask`` (all (B, L)); a 0-d tensor.

    ``estimator``: the run's bound estimator (``KLEstimator``, built once from the ``kl_estimator``
    group by ``kl.build_kl``: its name, clamps and params), a registered estimator's name (``"k1"``,
    ``"k3"``: ``named_kl``), or ``K2_REF_OVER_OLD`` (``logp`` is pi_old's, ``logp_other`` the
    reference's). ``logp`` is the policy that sampled the tokens: a measurement, not a loss, so an
    importance-weighted estimator's weight pi/pi_old is 1 here."""
    if isinstance(estimator, str):
        bound = named_kl(estimator)
        per_token = bound.reward(logp, logp_other) if estimator == K2_REF_OVER_OLD else bound(logp, logp_other)
    elif isinstance(estimator, KLEstimator):
        per_token = estimator(logp, logp_other, logp)  # pi sampled the tokens: an importance weight is 1
    else:
        raise TypeError(
            f"mean_kl takes a KLEstimator (kl.build_kl) or an estimator's name, got {type(estimator).__name__}"
        )
    return aggregate(per_token, mask, agg)


def reference_kl(
    estimator: Any,
    logp_old: torch.Tensor | None,
    logp_ref: torch.Tensor | None,
    mask: torch.Tensor | None,
    loss_agg: LossAgg,
    kl_old: float,
    ref_is_base: bool,
) -> KLStats:
    """The step's KL signals (``KLStats``) from the behaviour policy's (pi_old) and the reference's
    log-probs of the trained rows' sampled tokens (all (B, L), ``mask`` the completion tokens), with
    the diagnostics' mean of ``loss_agg`` (``diagnostic_agg``): ``ref`` with the run's ``estimator``,
    ``ref_k1`` (unbiased, comparable across estimators), ``k2_ref_over_old`` (the ProRL v2 blog
    formula, a diagnostic only); all NaN when there is no reference or no row (``logp_ref`` None or
    empty). ``kl_old``: the update's KL to pi_old; ``kl/base`` is ``ref`` while the reference is the
    initial base, else NaN (measured at validation)."""
    if logp_old is None or logp_ref is None or mask is None or logp_ref.numel() == 0:
        ref = ref_k1 = k2 = float("nan")
    else:
        agg = diagnostic_agg(loss_agg)
        ref = float(mean_kl(estimator, logp_old, logp_ref, mask, agg))
        ref_k1 = float(mean_kl("k1", logp_old, logp_ref, mask, agg))  # k1 takes no exp: no clamp applies
        k2 = float(mean_kl(K2_REF_OVER_OLD, logp_old, logp_ref, mask, agg))
    return KLStats(ref, ref_k1, k2, kl_old, ref if ref_is_base else float("nan"))

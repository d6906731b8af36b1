"""One helper for every KL the run measures (not the loss's KL term, which ``phases`` builds with
the estimator's gradient): a per-token estimate between two log-prob tensors, aggregated over the
completion tokens. Used for kl/ref and its variants, kl/old, kl/base and a reset's before/after KL."""

from __future__ import annotations

from typing import Any

import torch

from prorl_bench.config import LossAgg
from prorl_bench.rl.kl import KLEstimator, k2_ref_over_old, kl_per_token
from prorl_bench.rl.losses import aggregate

K2_REF_OVER_OLD = "k2_ref_over_old"  # the ProRL v2 blog formula (a diagnostic, no gradient)


def mean_kl(
    estimator: Any,
    logp: torch.Tensor,
    logp_other: torch.Tensor,
    mask: torch.Tensor,
    agg: LossAgg,
    clamps: tuple[float, float] | None = None,
) -> torch.Tensor:
    """KL(pi || other) per token, aggregated by ``agg`` over ``mask`` (all (B, L)); a 0-d tensor.

    ``estimator``: the run's bound estimator (``kl.KLEstimator``, built once from the ``kl_estimator``
    group: its name, clamps and params), a registered
    estimator's name (``"k1"``, ``"k3"``; ``clamps``: (log-ratio clamp, KL clamp), default the
    estimator's), or ``K2_REF_OVER_OLD`` (``logp`` is pi_old's, ``logp_other`` the reference's)."""
    if estimator == K2_REF_OVER_OLD:
        per_token = k2_ref_over_old(logp_other, logp)
    elif isinstance(estimator, str):
        per_token = kl_per_token(estimator, logp, logp_other, *(clamps or ()))
    else:
        if not isinstance(estimator, KLEstimator):
            raise TypeError(f"mean_kl takes the run's bound KLEstimator (kl.build_kl), got {type(estimator).__name__}")
        per_token = estimator(logp, logp_other)
    return aggregate(per_token, mask, agg)

"""The run's KL measurements (run/kl_measure.py): every one through a bound ``KLEstimator``, built once,
against the closed forms by hand on a masked batch."""

from __future__ import annotations

import math

import pytest
import torch

from prorl_bench.config import LossAgg
from prorl_bench.rl.kl import KLEstimator, k3
from prorl_bench.run.kl_measure import K2_REF_OVER_OLD, mean_kl, named_kl

LOGP = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]], dtype=torch.float64)  # pi (or pi_old)
OTHER = torch.tensor([[-1.5, -1.0, -30.0], [-0.2, -2.0, -4.0]], dtype=torch.float64)  # the reference
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)  # 5 completion tokens
L = [0.5, -1.0, 29.5, 0.0, -1.0]  # logp - other on the masked tokens


def _token_mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.parametrize(
    "name,per_token",
    [
        ("k1", L),
        ("k3", [min(math.exp(-x) - 1 + x, 10.0) for x in L]),  # (r - 1) - log r, r = e^-l; value clamp 10
        (K2_REF_OVER_OLD, [0.5 * min(abs(x), 10.0) ** 2 for x in L]),  # log pi_ref/pi_old clamped to +-10
    ],
)
def test_named_measurements_equal_their_closed_forms(name, per_token):
    got = float(mean_kl(name, LOGP, OTHER, MASK, LossAgg.token))
    assert got == pytest.approx(_token_mean(per_token), rel=1e-12)


def test_the_runs_estimator_and_a_named_one_are_the_same_bound_path():
    k2 = KLEstimator("k2")  # as build_kl makes it from the kl_estimator section
    assert float(mean_kl(k2, LOGP, OTHER, MASK, LossAgg.token)) == pytest.approx(_token_mean([0.5 * x * x for x in L]))
    assert named_kl("k3") is named_kl("k3")  # built once per process, nothing looked up per call
    assert named_kl(K2_REF_OVER_OLD).name == "k2"  # the ProRL v2 formula is k2's reward form
    with pytest.raises(TypeError, match="KLEstimator"):
        mean_kl(k3, LOGP, OTHER, MASK, LossAgg.token)  # an unbound estimator function: no clamps, refused

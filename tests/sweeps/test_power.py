"""The seed-count planner (prorl_bench/sweeps/power.py): the n it plans decides the cell ~80% of the time.

The simulations decide each replicate with the aggregator's own procedure: the exact sign-flip p
(``stats.sign_flip_p``) or the TOST p (``stats.tost_p``), Holm-adjusted (``stats.holm``) within a
family whose other cells are null (p = 1: Holm's first step, the case the planner plans for).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from prorl_bench.sweeps import power, stats

REPLICATES = 1000


def _decided(pvalues: np.ndarray, family: int) -> float:
    """Fraction of replicates whose Holm-adjusted p (the cell in a family of ``family``, others p = 1) < alpha."""
    return float(np.mean([stats.holm([p] + [1.0] * (family - 1))[0] < stats.ALPHA for p in pvalues]))


@pytest.mark.parametrize(("diff", "sd", "family"), [(0.03, 0.04, 3), (-0.02, 0.03, 1)])
def test_planned_n_decides_difference_in_75_to_85_percent(diff: float, sd: float, family: int) -> None:
    n = power.seeds_for_difference(diff, sd, family)
    assert n is not None and 10 <= n <= stats.EXACT_SIGN_FLIP_MAX_N  # exact sign-flip p, as the aggregator
    d = np.random.default_rng(7).normal(diff, sd, size=(REPLICATES, n))
    rate = _decided(np.array([stats.sign_flip_p(row) for row in d]), family)
    assert 0.75 <= rate <= 0.85, (n, rate)


@pytest.mark.parametrize(("diff", "sd", "margin", "family"), [(0.005, 0.03, 0.03, 3), (0.0, 0.04, 0.03, 1)])
def test_planned_n_decides_equivalence_in_75_to_85_percent(diff: float, sd: float, margin: float, family: int) -> None:
    n = power.seeds_for_equivalence(diff, sd, margin, family)
    assert n is not None and n >= 10
    d = np.random.default_rng(11).normal(diff, sd, size=(REPLICATES, n))
    rate = _decided(np.array([stats.tost_p(row, margin) for row in d]), family)
    assert 0.75 <= rate <= 0.85, (n, rate)


def test_planned_n_is_the_smallest_with_80_percent_power() -> None:
    diff, sd, a = 0.02, 0.03, stats.ALPHA / 2
    n = power.seeds_for_difference(diff, sd, family=2)
    assert n is not None
    assert power.power_difference(n - 1, diff, sd, a) < power.POWER <= power.power_difference(n, diff, sd, a)
    m = power.seeds_for_equivalence(0.01, sd, 0.03, family=2)
    assert m is not None
    assert power.power_tost(m - 1, 0.01, sd, 0.03, a) < power.POWER <= power.power_tost(m, 0.01, sd, 0.03, a)


def test_power_closed_forms() -> None:
    # no effect: the t test's power is its size; the noncentral t with nc = 0 is the central t
    assert power.power_difference(12, 0.0, 1.0, 0.05) == pytest.approx(0.05, abs=1e-9)
    # a large n: the noncentral t tends to the normal approximation Phi(d sqrt(n)/sd - z) (+ far tail)
    n, d, sd = 400, 0.1, 1.0
    z = sps.norm.ppf(0.975)
    normal = sps.norm.sf(z - d * math.sqrt(n) / sd) + sps.norm.cdf(-z - d * math.sqrt(n) / sd)
    assert power.power_difference(n, d, sd, 0.05) == pytest.approx(normal, abs=3e-3)
    # TOST with a true mean at the margin: power <= alpha (the test's size), for any n
    for n in (5, 20, 80):
        assert power.power_tost(n, 0.03, 0.02, 0.03, 0.05) <= 0.05 + 1e-3
    # TOST power approaches 1 with n when the true mean is inside
    assert power.power_tost(2000, 0.0, 0.05, 0.03, 0.05) > 0.999


def test_unreachable_and_zero_spread_follow_the_exact_rules() -> None:
    assert power.seeds_for_difference(0.0, 0.02) is None  # no effect is never "different"
    assert power.seeds_for_equivalence(0.04, 0.02, 0.03) is None  # outside the margin: never equivalent
    assert power.seeds_for_equivalence(0.0, 0.02, None) is None  # no margin declared
    assert power.seeds_for_difference(1e-6, 1.0) is None  # beyond MAX_N
    # sd = 0: the sign-flip p is 2/2^n, so at family 3 n must satisfy 3 * 2 / 2^n < 0.05 -> n = 7
    assert power.seeds_for_difference(0.01, 0.0, family=3) == 7
    assert 3 * 2 / 2**7 < 0.05 <= 3 * 2 / 2**6
    # ... and the TOST p is 2^-n: 3 / 2^n < 0.05 -> n = 6
    assert power.seeds_for_equivalence(0.01, 0.0, 0.03, family=3) == 6
    # the exact floor: however large the effect, the sign-flip p cannot pass alpha / 3 below n = 7
    assert power.seeds_for_difference(10.0, 0.01, family=3) == 7


def test_sd_from_interval_inverts_the_t_interval() -> None:
    d = np.random.default_rng(3).normal(0.01, 0.02, size=9)
    lo, hi = stats.t_interval(list(d))
    assert power.sd_from_interval(lo, hi, 9) == pytest.approx(float(np.std(d, ddof=1)), rel=1e-9)
    assert math.isnan(power.sd_from_interval(lo, hi, 1))


def test_the_aggregator_prints_the_plan_from_the_observed_paired_variance(tmp_path, capsys) -> None:
    """A study block of 8 seeds: `hard` loses 0.04 +/- noise, `soft` is within noise of keep. The printed
    plan and seed_plan.csv hold the planner's n for the observed diff and sd (recomputed from the raw
    per-seed differences here) with the block's primary family (2 cells)."""
    import pandas as pd

    from prorl_bench.sweeps import aggregate as agg
    from tests.sweep_factory import write_run

    study = {
        "question": "q?", "primary": [{"metric": "success_final", "direction": "higher", "margin": 0.03}],
        "baseline": "keep", "blocks": {"explore": "range(0,8)", "confirm": "range(8,16)"}, "block": "explore",
    }  # fmt: skip
    cfg = {"task": {"name": "reverse_digits"}, "algo": {"group_size": 8}, "steps": 10, "study": study}
    noise = np.random.default_rng(5).normal(0, 0.02, size=(2, 8))
    effect = {"keep": np.zeros(8), "hard": -0.04 + noise[0], "soft": 0.003 + noise[1]}
    summary = {"status": "completed", "steps_completed": 10}
    for arm, eff in effect.items():
        for seed in range(8):
            rows = [{"step": i + 1, "reward/mean": 0.5 + eff[seed], "success_rate": 0.5 + eff[seed]} for i in range(10)]
            write_run(tmp_path, [f"opt_reset={arm}", f"seed={seed}"], metrics=rows, summary=summary,
                      config={**cfg, "seed": seed})  # fmt: skip
    assert agg.main([str(tmp_path), "--no-figures", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "### Seeds for the next block" in out
    plan = pd.read_csv(tmp_path / "out" / "seed_plan.csv").set_index("group")
    for arm in ("hard", "soft"):
        d = effect[arm]
        row = plan.loc[arm]
        assert row["family_size"] == 2 and row["n"] == 8
        assert row["sd"] == pytest.approx(float(np.std(d, ddof=1)), rel=1e-6)
        assert row["n_difference"] == power.seeds_for_difference(float(d.mean()), float(np.std(d, ddof=1)), 2)
        n_eq = power.seeds_for_equivalence(float(d.mean()), float(np.std(d, ddof=1)), 0.03, 2)
        assert (math.isnan(row["n_equivalence"]) and n_eq is None) or row["n_equivalence"] == n_eq
        assert f"| explore | {arm} | success_final |" in out

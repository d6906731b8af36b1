"""Pure statistics of the aggregator against values worked out by hand or from t tables."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from prorl_bench import stats


def _brute_force_sign_flip(diffs):
    """All 2^n sign patterns enumerated by hand: p = #{|mean'| >= |mean|} / 2^n."""
    obs = abs(sum(diffs) / len(diffs))
    hits = sum(
        abs(sum(s * x for s, x in zip(signs, diffs)) / len(diffs)) >= obs - 1e-12
        for signs in itertools.product((1, -1), repeat=len(diffs))
    )
    return hits / 2 ** len(diffs)


@pytest.mark.parametrize(
    "diffs",
    [
        [0.1, 0.3, -0.05, 0.2],
        [1.0, 2.0, 3.0],
        [0.5, -0.4, 0.3, -0.2, 0.1],
        [-0.003, -0.005, -0.007, 0.001, -0.002, -0.004],
    ],
)
def test_sign_flip_matches_brute_force(diffs):
    assert stats.sign_flip_pvalue(diffs) == pytest.approx(_brute_force_sign_flip(diffs), abs=1e-12)


def test_sign_flip_floor_at_small_n():
    # all n differences positive: only the identity and the all-flipped pattern are as extreme
    assert stats.sign_flip_pvalue([0.1, 0.2, 0.3]) == pytest.approx(2 / 8)
    assert stats.sign_flip_pvalue([0.1] * 8) == pytest.approx(2 / 256)


def test_bootstrap_ci_known_answer():
    # mean of a resample of {0, 1}: 0, 0.5, 1 with probability 1/4, 1/2, 1/4 -> 95% percentile interval [0, 1]
    lo, hi = stats.bootstrap_ci([0.0, 1.0])
    assert (lo, hi) == (0.0, 1.0)
    # constant data: degenerate interval at the value
    assert stats.bootstrap_ci([0.3, 0.3, 0.3]) == (0.3, 0.3)
    # large n from a known normal: the percentile interval matches mean +- 1.96 s / sqrt(n) to ~5%
    x = np.random.default_rng(1).normal(2.0, 1.0, size=400)
    lo, hi = stats.bootstrap_ci(x)
    half = 1.96 * x.std(ddof=1) / math.sqrt(len(x))
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.08)
    assert (lo + hi) / 2 == pytest.approx(x.mean(), abs=0.2 * half)


def test_holm_hand_example():
    # sorted 0.01, 0.03, 0.04 -> 3*0.01 = 0.03, 2*0.03 = 0.06, max(0.06, 1*0.04) = 0.06; nan not counted
    out = stats.holm([0.01, 0.04, 0.03, float("nan")])
    assert out[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(out[3])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_paired_vs_welch():
    base = [0.550, 0.520, 0.580]
    group = [b - 0.005 + e for b, e in zip(base, (0.001, -0.001, 0.0))]
    c = stats.paired_comparison(group, base)
    assert c.paired and c.n == 3 and c.diff == pytest.approx(-0.005)
    assert c.p == pytest.approx(0.25)  # n = 3 exact floor
    assert c.lo <= c.diff <= c.hi < 0
    w = stats.welch_comparison(group, base)
    assert not w.paired and w.lo < 0 < w.hi and w.p > 0.5
    with pytest.raises(ValueError, match="3 group values vs 2"):
        stats.paired_comparison(group, base[:2])


def test_mean_ci_known_values():
    mean, half, n = stats.mean_ci([1.0, 2.0, 3.0])  # s = 1
    assert (mean, n) == (2.0, 3)
    assert half == pytest.approx(4.3026527 / math.sqrt(3), abs=1e-6)  # t(0.975, 2) from tables
    mean, half, n = stats.mean_ci([0.2, 0.4])  # s = 0.1414.., t(0.975, 1) = 12.706
    assert mean == pytest.approx(0.3)
    assert half == pytest.approx(12.7062047 * math.sqrt(0.02) / math.sqrt(2), rel=1e-6)


def test_mean_ci_drops_non_finite_and_handles_small_n():
    assert stats.mean_ci([1.0, None, float("nan"), 3.0])[::2] == (2.0, 2)
    m, half, n = stats.mean_ci([0.7])
    assert (m, n) == (0.7, 1) and math.isnan(half)
    m, half, n = stats.mean_ci([])
    assert n == 0 and math.isnan(m) and math.isnan(half)
    assert stats.mean_ci([5.0, 5.0, 5.0]) == (5.0, 0.0, 3)


def test_tail_mean_is_last_ten_percent():
    values = list(range(20))  # last 2 of 20
    assert stats.tail_mean(values) == 18.5
    assert stats.tail_mean([1.0, 2.0, 3.0]) == 3.0  # at least one value
    assert math.isnan(stats.tail_mean([]))


def test_normalized_auc():
    assert stats.normalized_auc([1, 2, 3], [0.0, 1.0, 1.0]) == pytest.approx(0.75)  # (0.5 + 1) / 2
    assert stats.normalized_auc([0, 10], [0.2, 0.6]) == pytest.approx(0.4)
    assert stats.normalized_auc([1, 2, 3], [0.5, None, 0.5]) == pytest.approx(0.5)  # gap skipped
    assert stats.normalized_auc([4], [0.3]) == 0.3
    assert math.isnan(stats.normalized_auc([], []))
    with pytest.raises(ValueError):
        stats.normalized_auc([2, 2], [0.1, 0.2])


def test_first_crossing_uses_trailing_window():
    steps = [1, 2, 3, 4, 5, 6]
    vals = [0.0, 1.0, 0.0, 0.6, 0.6, 0.6]
    assert stats.first_crossing(steps, vals, 0.5, window=1) == 2.0
    # full windows only: (0+1+0)/3 = .33 at step 3, (1+0+.6)/3 = .53 at step 4
    assert stats.first_crossing(steps, vals, 0.5, window=3) == 4.0
    assert math.isnan(stats.first_crossing([1, 2], [1.0, 1.0], 0.5, window=3))  # never a full window
    assert math.isnan(stats.first_crossing(steps, vals, 0.9, window=2))


def test_time_at_step_sums_step_times():
    assert stats.time_at_step([1, 2, 3], [0.1, 0.2, 0.4], 2.0) == pytest.approx(0.3)
    assert math.isnan(stats.time_at_step([1, 2], [0.1, 0.1], float("nan")))


def test_recovery_steps():
    steps = list(range(1, 11))
    # level 0.8 before the reset at step 4 (window 2: steps 3, 4), dip, back at step 8
    vals = [0.8, 0.8, 0.8, 0.8, 0.2, 0.4, 0.7, 0.9, 0.9, 0.9]
    assert stats.recovery_steps(steps, vals, [4], window=1) == [4.0]  # step 8 >= 0.8
    # window 2 after the event: (0.7 + 0.9) / 2 = 0.8 at step 8 as well
    assert stats.recovery_steps(steps, vals, [4], window=2) == [4.0]
    never = stats.recovery_steps(steps, [1.0] * 4 + [0.0] * 6, [4], window=1)
    assert math.isnan(never[0])
    assert math.isnan(stats.recovery_steps(steps, vals, [0], window=2)[0])  # no pre-event data


def test_rolling_mean_rejects_bad_window():
    with pytest.raises(ValueError):
        stats.rolling_mean([1.0], 0)

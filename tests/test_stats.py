"""Pure statistics of the aggregator against values worked out by hand or from t tables."""

from __future__ import annotations

import math

import pytest

from prorl_bench import stats


def test_mean_ci_uses_student_t_quantiles():
    for df, q975 in [(1, 12.7062047), (2, 4.3026527), (9, 2.2621572), (1000, 1.9623391)]:
        xs = [0.0, 1.0] if df == 1 else [float(i) for i in range(df + 1)]
        m, half, n = stats.mean_ci(xs)
        sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
        assert half == pytest.approx(q975 * sd / math.sqrt(n), rel=1e-6)


def test_mean_ci_known_values():
    mean, half, n = stats.mean_ci([1.0, 2.0, 3.0])  # s = 1
    assert (mean, n) == (2.0, 3)
    assert half == pytest.approx(4.3026527 / math.sqrt(3), abs=1e-6)
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


def test_rolling_mean_rejects_bad_window():
    with pytest.raises(ValueError):
        stats.rolling_mean([1.0], 0)


# --------------------------------------------------------------------------- comparisons


def _brute_sign_flip(diffs):
    """Two-sided p of the sign-flip test by enumerating all 2^n sign assignments."""
    import itertools

    obs = abs(sum(diffs))
    hits = total = 0
    for signs in itertools.product((1, -1), repeat=len(diffs)):
        total += 1
        hits += abs(sum(s * d for s, d in zip(signs, diffs))) >= obs - 1e-12
    return hits / total


@pytest.mark.parametrize("diffs", [[0.3, 0.1, 0.2], [1.0, -0.5, 0.25, 2.0], [0.1, 0.2, -0.05, 0.3, 0.15, 0.4]])
def test_sign_flip_p_is_exact(diffs):
    assert stats.sign_flip_p(diffs) == pytest.approx(_brute_sign_flip(diffs), abs=1e-12)


def test_three_seeds_cannot_reach_p_below_a_quarter():
    assert stats.sign_flip_p([0.1, 0.2, 0.3]) == pytest.approx(0.25)  # all positive: 2 of 8 assignments
    assert stats.sign_flip_p([0.0, 0.0]) == 1.0


def test_bootstrap_ci_known_answers():
    # constant differences: the interval is that value
    assert stats.bootstrap_ci([0.5, 0.5, 0.5]) == (0.5, 0.5)
    # a large normal sample: the percentile bootstrap CI of the mean approaches mean ± 1.96 s / sqrt(n)
    import numpy as np

    x = np.random.default_rng(1).normal(2.0, 1.0, size=400)
    lo, hi = stats.bootstrap_ci(list(x))
    half = 1.96 * x.std(ddof=1) / np.sqrt(len(x))
    assert lo == pytest.approx(x.mean() - half, abs=0.02) and hi == pytest.approx(x.mean() + half, abs=0.02)
    # two points: every resample mean lies between them
    lo, hi = stats.bootstrap_ci([0.0, 1.0])
    assert 0.0 <= lo < hi <= 1.0


def test_holm_matches_a_hand_computed_example():
    # sorted p: 0.01, 0.02, 0.03, 0.5 with m = 4 -> 0.04, 0.06, 0.06 (monotone), 0.5
    adjusted = stats.holm([0.03, 0.5, 0.01, float("nan"), 0.02])
    assert adjusted[2] == pytest.approx(0.04) and adjusted[4] == pytest.approx(0.06)
    assert adjusted[0] == pytest.approx(0.06) and adjusted[1] == pytest.approx(0.5) and math.isnan(adjusted[3])


def test_paired_and_welch_comparisons():
    c = stats.paired_comparison([1.0, 2.0, 3.0, None], [0.5, 1.5, 2.0, 1.0])  # the None pair is dropped
    assert c.paired and c.n == 3 and c.diff == pytest.approx((0.5 + 0.5 + 1.0) / 3)
    w = stats.welch_comparison([1.0, 2.0, 3.0], [0.0, 0.5, 1.0])
    from scipy.stats import ttest_ind

    assert not w.paired and w.p == pytest.approx(ttest_ind([1.0, 2.0, 3.0], [0.0, 0.5, 1.0], equal_var=False).pvalue)
    assert w.lo < w.diff < w.hi


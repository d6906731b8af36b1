"""Pure statistics of the aggregator against values worked out by hand or from t tables."""

from __future__ import annotations

import math

import pytest

from prorl_bench import stats


@pytest.mark.parametrize(
    "df, q975",
    [(1, 12.7062047), (2, 4.3026527), (4, 2.7764451), (9, 2.2621572), (29, 2.0452296), (1000, 1.9623391)],
)
def test_t_quantile_matches_tables(df, q975):
    assert stats.t_quantile(0.975, df) == pytest.approx(q975, abs=1e-6)
    assert stats.t_quantile(0.025, df) == pytest.approx(-q975, abs=1e-6)


def test_t_cdf_symmetry_and_center():
    assert stats.t_cdf(0.0, 3) == pytest.approx(0.5)
    assert stats.t_cdf(1.3, 5) + stats.t_cdf(-1.3, 5) == pytest.approx(1.0)
    # df = 1 is the Cauchy distribution: F(t) = 1/2 + atan(t)/pi
    assert stats.t_cdf(2.0, 1) == pytest.approx(0.5 + math.atan(2.0) / math.pi, abs=1e-12)


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

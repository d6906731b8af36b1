"""Pure statistics for sweep aggregation: intervals, paired comparisons, curve summaries.

No I/O and no pandas here: every function takes plain sequences so it can be tested on numbers
worked out by hand. Distributions and resampling come from ``scipy.stats`` (``t``, ``bootstrap``,
``permutation_test``, ``ttest_ind``). Units follow the inputs (steps are RL steps, times are seconds,
rewards are the task's reward units); each function says what it returns.

Why paired: runs that share a seed share the base policy and the prompt stream, so arms of one
sweep are paired by design (their trajectories are bit-identical until they first differ). The
per-seed difference removes the seed-to-seed variance an unpaired interval carries; with n seeds the
exact sign-flip test cannot go below p = 2 / 2^n (0.25 at n = 3), so studies need >= 6-8 seeds.
Agarwal et al. 2021 ("Deep RL at the edge of the statistical precipice") is the reference for
honest aggregate reporting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

NAN = float("nan")
LEVEL = 0.95  # every interval in tables and figures
ALPHA = 0.05  # family-wise error rate of a study's primary family (and the TOST level)
MONTE_CARLO_RESAMPLES = 100_000  # sign assignments drawn above EXACT_SIGN_FLIP_MAX_N (fixed seed)
EXACT_SIGN_FLIP_MAX_N = 24  # 2^24 assignments, counted exactly by meet in the middle in milliseconds


def finite(values: Sequence[float | None]) -> list[float]:
    """The values that are real, finite numbers (None and NaN/inf dropped)."""
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def mean_ci(values: Sequence[float | None], level: float = 0.95) -> tuple[float, float, int]:
    """(mean, half-width of the two-sided t confidence interval, n) over the finite values.

    half-width = t_{(1+level)/2, n-1} * s / sqrt(n) with the sample standard deviation s (ddof=1).
    n = 0 gives (nan, nan, 0); n = 1 gives (value, nan, 1): one seed has no interval.
    """
    xs = finite(values)
    n = len(xs)
    if n == 0:
        return NAN, NAN, 0
    m = sum(xs) / n
    if n == 1:
        return m, NAN, 1
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    return m, float(sps.t.ppf(0.5 + level / 2.0, n - 1)) * sd / math.sqrt(n), n


# --------------------------------------------------------------------------- curves


def tail_mean(values: Sequence[float | None], fraction: float = 0.1) -> float:
    """Mean of the finite values among the last max(1, floor(n * fraction)) entries (as trainer.summarize)."""
    if not values:
        return NAN
    k = max(1, int(len(values) * fraction))
    xs = finite(values[-k:])
    return sum(xs) / len(xs) if xs else NAN


def normalized_auc(steps: Sequence[float], values: Sequence[float | None]) -> float:
    """Trapezoidal area under ``values`` over ``steps`` divided by the step span.

    The result is in the units of ``values`` (a time-averaged reward): comparable across runs of
    different length. Points with a non-finite value are skipped; one point returns its value.
    """
    pts = [(float(s), float(v)) for s, v in zip(steps, values) if v is not None and math.isfinite(float(v))]
    if not pts:
        return NAN
    if len(pts) == 1:
        return pts[0][1]
    area = sum((s1 - s0) * (v0 + v1) / 2.0 for (s0, v0), (s1, v1) in zip(pts, pts[1:]))
    span = pts[-1][0] - pts[0][0]
    if span <= 0:
        raise ValueError("normalized_auc: steps must be increasing")
    return area / span


def rolling_mean(values: Sequence[float | None], window: int) -> list[float]:
    """Trailing rolling mean over the last ``window`` finite values (shorter at the start)."""
    if window < 1:
        raise ValueError(f"rolling_mean: window={window} must be >= 1")
    out = []
    for i in range(len(values)):
        xs = finite(values[max(0, i - window + 1) : i + 1])
        out.append(sum(xs) / len(xs) if xs else NAN)
    return out


def first_crossing(steps: Sequence[float], values: Sequence[float | None], threshold: float, window: int = 1) -> float:
    """First step at which the trailing ``window``-step mean of ``values`` is >= ``threshold``.

    Only full windows count (the first candidate is the ``window``-th step), so one lucky early
    step cannot cross alone. Returns nan when the curve never reaches the threshold.
    """
    smooth = rolling_mean(values, window)
    for i, (s, v) in enumerate(zip(steps, smooth)):
        if i >= window - 1 and math.isfinite(v) and v >= threshold:
            return float(s)
    return NAN


def time_at_step(steps: Sequence[float], step_times: Sequence[float | None], step: float) -> float:
    """Cumulative step time (seconds, sum of ``time/step``) up to and including ``step``; nan for nan."""
    if not math.isfinite(step):
        return NAN
    return sum(t for s, t in zip(steps, step_times) if s <= step and t is not None and math.isfinite(t))


# --------------------------------------------------------------------------- comparisons


@dataclass(frozen=True)
class Comparison:
    """A difference (group - baseline) with its interval, p-values and how it was computed.

    ``paired``: per-seed differences (Student t interval of their mean, exact sign-flip p, TOST p
    against ``margin``); otherwise Welch's unequal-variance t test and interval. ``p_holm`` and
    ``p_equiv_holm`` are filled in by ``holm`` across a family of primary endpoints; nan for a
    descriptive cell. ``p_equiv``: the paired TOST p for |difference| < ``margin`` (nan without a margin).
    """

    diff: float
    lo: float
    hi: float
    p: float
    n: int
    paired: bool
    p_holm: float = NAN
    margin: float = NAN
    p_equiv: float = NAN
    p_equiv_holm: float = NAN


def _signed_sums(d: np.ndarray) -> np.ndarray:
    """All 2^k sums sum_i s_i d_i with s_i in {+1, -1}, k = len(d) (bit i of the row index is s_i)."""
    bits = (np.arange(2 ** len(d), dtype=np.int64)[:, None] >> np.arange(len(d))) & 1
    return (1 - 2 * bits).astype(float) @ d


def exact_sign_flip_p(diffs: Sequence[float]) -> float:
    """Exact two-sided sign-flip p: the fraction of all 2^n sign assignments whose |sum| is at least
    the observed |sum| (ties included, within 1e-10 of sum |d| for float rounding).

    Meet in the middle instead of enumerating 2^n rows: the signed sums of the first half (2^(n/2)
    values) and of the second half (sorted) give every total as a + b, and for each a the number of b
    with |a + b| >= obs is two binary searches. n = 24 costs 2 x 4096 sums, not 16.7M rows of 24.
    """
    d = np.asarray(diffs, dtype=float)
    n = len(d)
    if n > EXACT_SIGN_FLIP_MAX_N:
        raise ValueError(f"exact_sign_flip_p: n={n} > {EXACT_SIGN_FLIP_MAX_N} (use sign_flip_p: Monte Carlo)")
    threshold = abs(d.sum()) - 1e-10 * np.abs(d).sum()
    if threshold <= 0:  # observed sum is 0: every assignment is at least as extreme
        return 1.0
    a = _signed_sums(d[: n // 2])
    b = np.sort(_signed_sums(d[n // 2 :]))
    upper = len(b) - np.searchsorted(b, threshold - a, side="left")  # a + b >= threshold
    lower = np.searchsorted(b, -threshold - a, side="right")  # a + b <= -threshold (disjoint: threshold > 0)
    return float((upper.sum() + lower.sum()) / 2.0**n)


def sign_flip_p(diffs: Sequence[float], seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip (permutation) test of mean(diffs) = 0.

    Valid under the sharp null "the arm changes no seed's outcome": then each per-seed difference is
    as likely to have either sign. Exact for n <= EXACT_SIGN_FLIP_MAX_N (``exact_sign_flip_p``).
    Above, ``scipy.stats.permutation_test`` samples ``MONTE_CARLO_RESAMPLES`` assignments with a
    fixed seed (p = (hits + 1) / (resamples + 1), reproducible). All-zero differences give p = 1.
    """
    d = np.asarray(finite(diffs), dtype=float)
    if len(d) == 0:
        return NAN
    if not np.any(d) or len(d) == 1:  # one pair: both sign assignments are as extreme
        return 1.0
    if len(d) <= EXACT_SIGN_FLIP_MAX_N:
        return exact_sign_flip_p(d)
    res = sps.permutation_test(
        (d,), np.mean, permutation_type="samples", alternative="two-sided",
        n_resamples=MONTE_CARLO_RESAMPLES, random_state=np.random.default_rng(seed),
    )  # fmt: skip
    return float(res.pvalue)


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Student t interval of the mean: mean -/+ t_{(1+level)/2, n-1} s / sqrt(n) (s with ddof=1).

    Chosen over the percentile bootstrap and BCa by the coverage simulation in
    ``tests/sweeps/test_stats.py`` (nominal 95%, n = 8: t 0.95 on normal data, 0.94 on a skewed beta(2,5);
    percentile bootstrap 0.88; BCa no better). n < 2: (nan, nan); all values equal: that value twice.
    """
    m, half, n = mean_ci(values, level)
    if n < 2:
        return NAN, NAN
    return m - half, m + half


def paired_ratio_interval(
    x: Sequence[float | None], y: Sequence[float | None], level: float = LEVEL
) -> tuple[float, float, float, int]:
    """Ratio of means mean(x) / mean(y) of seed-paired values with its Fieller interval: (ratio, lo, hi, n).

    The interval is every rho for which a paired t test of x - rho*y = 0 does not reject at ``level``:
    (xbar - rho*ybar)^2 <= t^2 (s_xx - 2 rho s_xy + rho^2 s_yy) / n, a quadratic in rho. Its coverage is the
    paired t test's (exact for normal differences; checked by simulation in ``tests/sweeps/test_stats.py``).
    When mean(y) is not itself distinguishable from 0 the set is unbounded: (ratio, nan, nan, n).
    Pairs with a missing or non-finite member are dropped; n < 2 gives nan bounds."""
    pairs = [(float(a), float(b)) for a, b in zip(x, y) if a is not None and b is not None
             and math.isfinite(float(a)) and math.isfinite(float(b))]  # fmt: skip
    n = len(pairs)
    if n == 0:
        return NAN, NAN, NAN, 0
    xs, ys = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    ratio = float(xs.mean() / ys.mean()) if ys.mean() != 0 else NAN
    if n < 2:
        return ratio, NAN, NAN, n
    t2 = float(sps.t.ppf(0.5 + level / 2.0, n - 1)) ** 2 / n
    cov = np.cov(xs, ys, ddof=1)
    a = ys.mean() ** 2 - t2 * cov[1, 1]
    b = xs.mean() * ys.mean() - t2 * cov[0, 1]
    c = xs.mean() ** 2 - t2 * cov[0, 0]
    disc = b * b - a * c
    if a <= 0 or disc < 0:
        return ratio, NAN, NAN, n
    root = math.sqrt(disc)
    return ratio, float((b - root) / a), float((b + root) / a), n


def tost_p(diffs: Sequence[float], margin: float) -> float:
    """Paired TOST p (Schuirmann 1987) for equivalence |mean difference| < ``margin``.

    Two one-sided t tests on the n differences with standard error se = s / sqrt(n), df = n - 1:
    H0a: mean <= -margin (statistic (mean + margin) / se, upper tail) and H0b: mean >= +margin
    ((mean - margin) / se, lower tail); p = max of the two. p < alpha is the same as the (1 - 2 alpha)
    t interval lying inside (-margin, +margin). Equal differences (se = 0, where t is undefined): the
    one-sided sign-flip bound 2^-n inside the margin (every shifted difference has the same sign), 1
    outside — so three identical seeds give 1/8, never certainty. n < 2 or no margin: nan.
    """
    d = finite(diffs)
    n = len(d)
    if n < 2 or not math.isfinite(margin) or margin <= 0:
        return NAN
    m = sum(d) / n
    se = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1) / n)
    if se == 0:
        return 0.5**n if abs(m) < margin else 1.0
    p_low = float(sps.t.sf((m + margin) / se, n - 1))
    p_high = float(sps.t.cdf((m - margin) / se, n - 1))
    return max(p_low, p_high)


def paired_comparison(
    group: Sequence[float], baseline: Sequence[float], level: float = LEVEL, margin: float = NAN
) -> Comparison:
    """Paired difference of two equally long sequences aligned by seed (pairs with a non-finite
    member are dropped): mean difference, t interval, exact sign-flip p, TOST p against ``margin``."""
    if len(group) != len(baseline):
        raise ValueError(f"paired_comparison: {len(group)} values vs {len(baseline)} baseline values")
    diffs = [
        float(a) - float(b)
        for a, b in zip(group, baseline)
        if a is not None and b is not None and math.isfinite(float(a)) and math.isfinite(float(b))
    ]
    if not diffs:
        return Comparison(NAN, NAN, NAN, NAN, 0, True, margin=margin)
    lo, hi = t_interval(diffs, level)
    mean = sum(diffs) / len(diffs)
    return Comparison(mean, lo, hi, sign_flip_p(diffs), len(diffs), True, margin=margin, p_equiv=tost_p(diffs, margin))


def welch_comparison(group: Sequence[float], baseline: Sequence[float], level: float = LEVEL) -> Comparison:
    """Unpaired difference of means: Welch's t interval and two-sided p (``scipy.stats.ttest_ind``).
    No equivalence test: unpaired cells never get an "equivalent" verdict."""
    a, b = np.asarray(finite(group), dtype=float), np.asarray(finite(baseline), dtype=float)
    n = min(len(a), len(b))
    if len(a) == 0 or len(b) == 0:
        return Comparison(NAN, NAN, NAN, NAN, 0, False)
    diff = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return Comparison(diff, NAN, NAN, NAN, n, False)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb == 0:
        return Comparison(diff, diff, diff, 1.0 if diff == 0 else 0.0, n, False)
    res = sps.ttest_ind(a, b, equal_var=False)
    ci = res.confidence_interval(confidence_level=level)
    return Comparison(diff, float(ci.low), float(ci.high), float(res.pvalue), n, False)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values (family-wise error control), NaNs kept in place.

    Sorted ascending p_(1) <= ... <= p_(m): adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)).
    """
    idx = [i for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    m = len(idx)
    out = [NAN] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


# --------------------------------------------------------------------------- verdicts

DIFFERENT, EQUIVALENT, UNDECIDED = "different", "equivalent", "undecided"
REPLICATED = "replicated"
REPLICATED_EQUIVALENT = "replicated (equivalent in both)"
NOT_REPLICATED = "not replicated"
NOTHING_TO_REPLICATE = "undecided (no explore conclusion)"


def verdict(p_holm: float, p_equiv_holm: float, alpha: float = ALPHA) -> str:
    """The conclusion of one primary cell, from its family-adjusted p-values.

    ``different`` when the Holm-adjusted difference p < alpha; else ``equivalent`` when the
    Holm-adjusted TOST p < alpha (the study declared a margin); else ``undecided``. Never "no
    difference": a large p alone says nothing about equality. A cell both different and inside the
    margin (a significant but small effect) is ``different``; the report says it is within the margin.
    """
    if math.isfinite(p_holm) and p_holm < alpha:
        return DIFFERENT
    if math.isfinite(p_equiv_holm) and p_equiv_holm < alpha:
        return EQUIVALENT
    return UNDECIDED


def replication(explore: str, explore_diff: float, confirm: str, confirm_diff: float) -> str:
    """Did the explore block's conclusion hold on the confirm block's seeds? (docs/studies.md)

    * ``replicated``: different in both blocks, with the same sign of the difference;
    * ``replicated (equivalent in both)``: equivalent within the margin in both;
    * ``not replicated``: explore concluded (different or equivalent) and confirm did not reach the
      same conclusion (undecided, the other conclusion, or a difference of the opposite sign);
    * ``undecided (no explore conclusion)``: explore was undecided, so there was nothing to confirm
      (whatever confirm shows is a new, unconfirmed finding).
    """
    if explore == UNDECIDED:
        return NOTHING_TO_REPLICATE
    if (
        explore == DIFFERENT
        and confirm == DIFFERENT
        and math.copysign(1, explore_diff) == math.copysign(1, confirm_diff)
    ):
        return REPLICATED
    if explore == EQUIVALENT and confirm == EQUIVALENT:
        return REPLICATED_EQUIVALENT
    return NOT_REPLICATED


def window_mean(steps: Sequence[float], values: Sequence[float | None], start: float, end: float) -> float:
    """Mean of the finite values at steps in (start, end] (nan if none)."""
    xs = finite([v for s, v in zip(steps, values) if start < s <= end])
    return sum(xs) / len(xs) if xs else NAN

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
BOOTSTRAP_RESAMPLES = 10_000
EXACT_SIGN_FLIP_MAX_N = 16  # 2^16 sign patterns: still enumerated in well under a second


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
    """A difference (group - baseline) with its interval, p-value and how it was computed.

    ``paired``: per-seed differences (bootstrap CI of their mean, exact sign-flip p); otherwise
    Welch's unequal-variance t test and interval. ``p_holm`` is filled in by ``holm`` across a table.
    """

    diff: float
    lo: float
    hi: float
    p: float
    n: int
    paired: bool
    p_holm: float = NAN


def sign_flip_p(diffs: Sequence[float], seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip (permutation) test of mean(diffs) = 0.

    Exact for n <= EXACT_SIGN_FLIP_MAX_N: ``permutation_test`` enumerates all 2^n sign assignments
    when ``n_resamples >= 2^n``, so it is given exactly 2^n. Above that (2^n > 65 536 patterns) it
    samples ``BOOTSTRAP_RESAMPLES`` assignments with a fixed seed, so tables stay reproducible.
    All-zero differences give p = 1.
    """
    d = np.asarray(finite(diffs), dtype=float)
    if len(d) == 0:
        return NAN
    if not np.any(d) or len(d) == 1:  # one pair: both sign assignments are as extreme
        return 1.0
    exact = len(d) <= EXACT_SIGN_FLIP_MAX_N
    res = sps.permutation_test(
        (d,), np.mean, permutation_type="samples", alternative="two-sided",
        n_resamples=2 ** len(d) if exact else BOOTSTRAP_RESAMPLES, random_state=np.random.default_rng(seed),
    )  # fmt: skip
    return float(res.pvalue)


def bootstrap_ci(values: Sequence[float], level: float = LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (``scipy.stats.bootstrap``, 10 000 resamples,
    fixed seed so tables are reproducible). Percentile rather than BCa: BCa's acceleration is
    undefined for the tiny, often tied samples (3-8 seeds) a sweep gives. n < 2: (nan, nan);
    all values equal: that value twice."""
    x = np.asarray(finite(values), dtype=float)
    if len(x) < 2:
        return NAN, NAN
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    res = sps.bootstrap(
        (x,), np.mean, confidence_level=level, n_resamples=BOOTSTRAP_RESAMPLES, method="percentile",
        random_state=np.random.default_rng(seed),
    )  # fmt: skip
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def paired_comparison(group: Sequence[float], baseline: Sequence[float], level: float = LEVEL) -> Comparison:
    """Paired difference of two equally long sequences aligned by seed (pairs with a non-finite
    member are dropped): mean difference, bootstrap CI, exact sign-flip p."""
    if len(group) != len(baseline):
        raise ValueError(f"paired_comparison: {len(group)} values vs {len(baseline)} baseline values")
    diffs = [
        float(a) - float(b)
        for a, b in zip(group, baseline)
        if a is not None and b is not None and math.isfinite(float(a)) and math.isfinite(float(b))
    ]
    if not diffs:
        return Comparison(NAN, NAN, NAN, NAN, 0, True)
    lo, hi = bootstrap_ci(diffs, level)
    return Comparison(sum(diffs) / len(diffs), lo, hi, sign_flip_p(diffs), len(diffs), True)


def welch_comparison(group: Sequence[float], baseline: Sequence[float], level: float = LEVEL) -> Comparison:
    """Unpaired difference of means: Welch's t interval and two-sided p (``scipy.stats.ttest_ind``)."""
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


def window_mean(steps: Sequence[float], values: Sequence[float | None], start: float, end: float) -> float:
    """Mean of the finite values at steps in (start, end] (nan if none)."""
    xs = finite([v for s, v in zip(steps, values) if start < s <= end])
    return sum(xs) / len(xs) if xs else NAN

"""Pure statistics for sweep aggregation: t intervals, paired comparisons, Holm, curve summaries.

Distributions and resampling come from scipy.stats (``t``, ``bootstrap``, ``permutation_test``,
``ttest_ind``); nothing here re-implements a distribution.

No I/O and no pandas here: every function takes plain sequences so it can be tested on numbers
worked out by hand. Units follow the inputs (steps are RL steps, times are seconds, rewards are the
task's reward units); each function says what it returns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

NAN = float("nan")


# --------------------------------------------------------------------------- unpaired (Student t)


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


def recovery_steps(
    steps: Sequence[float], values: Sequence[float | None], event_steps: Sequence[float], window: int = 5
) -> list[float]:
    """Steps each event (e.g. a reference reset) took to regain the pre-event level.

    For an event at step e, the pre-event level is the mean of ``values`` at the last ``window``
    steps <= e; recovery is the first step s > e at which the mean of the post-event values over the
    last ``window`` steps up to s (never reaching back before e) is back at that level, reported as
    s - e (RL steps). nan when it never recovers or there is no pre-event data.
    """
    pts = [(float(s), v) for s, v in zip(steps, values)]
    out = []
    for e in event_steps:
        before = finite([v for s, v in pts if s <= e][-window:])
        if not before:
            out.append(NAN)
            continue
        level = sum(before) / len(before)
        after = [(s, v) for s, v in pts if s > e]
        rec = NAN
        for i, (s, _) in enumerate(after):
            xs = finite([v for _, v in after[max(0, i - window + 1) : i + 1]])
            if xs and sum(xs) / len(xs) >= level:
                rec = s - e
                break
        out.append(rec)
    return out


# --------------------------------------------------------------------------- paired comparisons

BOOTSTRAP_METHOD = "percentile"  # BCa is unstable at n < ~10 and undefined for constant data
BOOTSTRAP_RESAMPLES = 9999
EXACT_MAX_N = 16  # 2^16 sign patterns: enumerate exactly up to here, Monte Carlo above


@dataclass
class Comparison:
    """One group against the baseline on one metric.

    ``diff`` is mean(group) - mean(baseline) (paired: the mean of per-seed differences); ``lo, hi``
    the 95% interval of that difference (paired: percentile bootstrap of the mean difference;
    unpaired: Welch t interval); ``p`` the two-sided p-value (paired: sign-flip permutation test,
    exact when n <= EXACT_MAX_N; unpaired: Welch t test); ``p_holm`` filled by ``holm``; ``n`` the
    number of pairs (paired) or ``n_group + n_baseline`` is in ``n_group``/``n_base``.
    """

    paired: bool
    diff: float
    lo: float
    hi: float
    p: float
    n: int
    n_base: int = 0
    p_holm: float = float("nan")


def sign_flip_pvalue(diffs: Sequence[float], exact_max_n: int = EXACT_MAX_N, seed: int = 0) -> float:
    """Two-sided sign-flip (paired permutation) p-value of H0: the differences are symmetric about 0.

    Statistic: the mean difference. scipy.stats.permutation_test with permutation_type='samples'
    on (diffs, -diffs) flips the sign of each pair; it enumerates all 2^n patterns when n <=
    ``exact_max_n`` (exact p = #{|mean'| >= |mean|} / 2^n, identity pattern included) and samples
    otherwise. n = 0 gives nan.
    """
    d = np.asarray(finite(list(diffs)), dtype=float)
    if d.size == 0:
        return NAN
    if np.all(d == 0):
        return 1.0
    n_resamples = 2**d.size if d.size <= exact_max_n else BOOTSTRAP_RESAMPLES
    res = sps.permutation_test(
        (d, -d),
        lambda x, y, axis: np.mean(x, axis=axis),
        permutation_type="samples",
        alternative="two-sided",
        n_resamples=n_resamples,
        vectorized=True,
        random_state=seed,
    )
    return float(min(1.0, res.pvalue))


def bootstrap_ci(values: Sequence[float], level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (scipy.stats.bootstrap, 9999 resamples, fixed seed).

    n < 2 gives (nan, nan); constant data gives (value, value).
    """
    x = np.asarray(finite(list(values)), dtype=float)
    if x.size < 2:
        return NAN, NAN
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    res = sps.bootstrap(
        (x,), np.mean, confidence_level=level, n_resamples=BOOTSTRAP_RESAMPLES,
        method=BOOTSTRAP_METHOD, random_state=seed, vectorized=True,
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def paired_comparison(group: Sequence[float], base: Sequence[float], level: float = 0.95) -> Comparison:
    """Paired comparison of equal-length per-seed values (``group[i]`` pairs with ``base[i]``).

    Pairs where either side is missing (None/nan) are dropped; n counts the rest.
    """
    if len(group) != len(base):
        raise ValueError(f"paired_comparison: {len(group)} group values vs {len(base)} baseline values")
    d = [
        float(g) - float(b)
        for g, b in zip(group, base)
        if g is not None and b is not None and math.isfinite(float(g)) and math.isfinite(float(b))
    ]
    if not d:
        return Comparison(True, NAN, NAN, NAN, NAN, 0, 0)
    lo, hi = bootstrap_ci(d, level)
    return Comparison(True, float(np.mean(d)), lo, hi, sign_flip_pvalue(d), len(d), len(d))


def welch_comparison(group: Sequence[float], base: Sequence[float], level: float = 0.95) -> Comparison:
    """Unpaired comparison: difference of means with a Welch t interval and Welch t-test p-value."""
    g, b = finite(list(group)), finite(list(base))
    if not g or not b:
        return Comparison(False, NAN, NAN, NAN, NAN, len(g), len(b))
    diff = float(np.mean(g) - np.mean(b))
    if len(g) < 2 or len(b) < 2:
        return Comparison(False, diff, NAN, NAN, NAN, len(g), len(b))
    vg, vb = np.var(g, ddof=1) / len(g), np.var(b, ddof=1) / len(b)
    se = math.sqrt(vg + vb)
    if se == 0:
        return Comparison(False, diff, diff, diff, 1.0 if diff == 0 else 0.0, len(g), len(b))
    dof = (vg + vb) ** 2 / (vg**2 / (len(g) - 1) + vb**2 / (len(b) - 1))
    q = float(sps.t.ppf(0.5 + level / 2.0, dof))
    p = float(sps.ttest_ind(g, b, equal_var=False).pvalue)
    return Comparison(False, diff, diff - q * se, diff + q * se, p, len(g), len(b))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (step-down, monotone, capped at 1); nan entries stay nan
    and do not count towards the number of hypotheses."""
    idx = [i for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    m = len(idx)
    out = [NAN] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda j: pvalues[j])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


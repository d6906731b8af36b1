"""Pure statistics for sweep aggregation: Student-t confidence intervals and curve summaries.

No I/O and no pandas here: every function takes plain sequences so it can be tested on numbers
worked out by hand. Units follow the inputs (steps are RL steps, times are seconds, rewards are the
task's reward units); each function says what it returns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

NAN = float("nan")


# --------------------------------------------------------------------------- Student t


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the regularized incomplete beta (modified Lentz's method)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta did not converge for a={a}, b={b}, x={x}")


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b) for a, b > 0 and x in [0, 1]."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc: x={x} outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """CDF of Student's t distribution with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"t_cdf: df={df} must be > 0")
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """Quantile (inverse CDF) of Student's t, by bisection on ``t_cdf`` to ~1e-12."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p={p} outside (0, 1)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


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
    return m, t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n), n


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

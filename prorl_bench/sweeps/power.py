"""How many seeds the next block needs: power of the paired tests a study's verdict uses.

Pure functions, no I/O. From one finished block a primary cell gives the mean per-seed difference
``diff`` and the standard deviation ``sd`` of the per-seed differences (ddof 1); the next block's n
is the smallest n whose power reaches ``POWER`` (0.8) for each of the two decisions the aggregator
can reach (``stats.verdict``):

* **different**: two-sided paired t test at level alpha / m, m = the cells of the primary family
  (Holm's first step: exact for the cell with the smallest p, conservative for the others). Power
  from the noncentral t (exact for normal differences):

      power(n) = P(|T| > t_{1 - a/2, n-1}),  T ~ nct(df = n - 1, nc = diff * sqrt(n) / sd),  a = alpha / m.

  The aggregator's p is the exact sign-flip p, not t's: for normal differences the two have nearly
  the same power once n >= ~8 (the sign-flip p's floor 2 / 2^n is below a), and
  ``tests/sweeps/test_power.py`` checks the planned n against blocks decided by the sign-flip test itself.
* **equivalent within +/-margin**: TOST (two one-sided t tests at level a, as ``stats.tost_p``).
  Its exact power integrates over the sample standard deviation S (sd^2 chi^2_{n-1} / (n - 1)):

      power(n) = E_S[ max(0, Phi((margin - c S - diff) / se) - Phi((-margin + c S - diff) / se)) ],
      c = t_{1 - a, n-1} / sqrt(n),  se = sd / sqrt(n)

  (the 1 - 2a t interval must lie inside (-margin, +margin)), evaluated as the mean over 400
  equally likely quantiles of S (midpoint rule on S's distribution: smooth, fixed, no sampling).

Unreachable cases are said, not guessed: a difference of exactly 0 is never ``different``; a
|diff| >= margin is never ``equivalent`` (``None``: no n suffices). Zero spread (sd = 0) follows the
aggregator's exact rule: the sign-flip p is 2 / 2^n and the TOST p 2^-n, so n is the smallest with
m * p < alpha. ``MAX_N`` caps the search (returned as ``None`` beyond it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from prorl_bench.sweeps.stats import ALPHA

POWER = 0.8  # planned power of each decision
MAX_N = 2000  # seeds; beyond this the plan says "not reachable"
_QUANTILES = (np.arange(400) + 0.5) / 400  # midpoints: the chi distribution's quadrature grid


def power_difference(n: int, diff: float, sd: float, alpha: float) -> float:
    """Power of the two-sided paired t test at level ``alpha`` with n pairs, true mean ``diff``, sd ``sd``."""
    if n < 2:
        return 0.0
    crit = sps.t.ppf(1 - alpha / 2, n - 1)
    nc = diff * math.sqrt(n) / sd
    return float(sps.nct.sf(crit, n - 1, nc) + sps.nct.cdf(-crit, n - 1, nc))


def power_tost(n: int, diff: float, sd: float, margin: float, alpha: float) -> float:
    """Power of the paired TOST (each one-sided test at ``alpha``) for |mean| < ``margin`` with n pairs."""
    if n < 2:
        return 0.0
    df = n - 1
    s = sd * np.sqrt(sps.chi2.ppf(_QUANTILES, df) / df)  # equally likely values of the sample sd
    se = sd / math.sqrt(n)
    half = margin - sps.t.ppf(1 - alpha, df) * s / math.sqrt(n)  # the mean must lie in (-half, +half)
    inside = sps.norm.cdf((half - diff) / se) - sps.norm.cdf((-half - diff) / se)
    return float(np.mean(np.where(half > 0, inside, 0.0)))


def _search(power_at, alpha_floor: int | None) -> int | None:
    """Smallest n in [2, MAX_N] with power_at(n) >= POWER (power is increasing in n: bisection after a
    doubling bracket); ``alpha_floor``: the smallest n at which the exact tests can reach the level at all."""
    lo = max(2, alpha_floor or 2)
    if power_at(lo) >= POWER:
        return lo
    hi = lo
    while power_at(hi) < POWER:
        if hi >= MAX_N:
            return None
        lo, hi = hi, min(MAX_N, hi * 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if power_at(mid) >= POWER else (mid, hi)
    return hi


def _exact_floor(alpha: float, numerator: float) -> int:
    """Smallest n with numerator / 2^n < alpha: below it the exact p cannot reach the level."""
    return max(2, math.floor(math.log2(numerator / alpha)) + 1)


def seeds_for_difference(diff: float, sd: float, family: int = 1, alpha: float = ALPHA) -> int | None:
    """Seeds per arm (pairs) for 80% power to call the cell ``different`` (None: unreachable)."""
    a = alpha / family
    floor = _exact_floor(a, 2.0)  # the sign-flip p is at least 2 / 2^n
    if not (math.isfinite(diff) and math.isfinite(sd)) or diff == 0:
        return None
    if sd == 0:
        return floor
    return _search(lambda n: power_difference(n, diff, sd, a), floor)


def seeds_for_equivalence(
    diff: float, sd: float, margin: float | None, family: int = 1, alpha: float = ALPHA
) -> int | None:
    """Seeds per arm (pairs) for 80% power to call the cell ``equivalent within +/-margin`` (None: unreachable)."""
    a = alpha / family
    if margin is None or not (math.isfinite(diff) and math.isfinite(sd) and math.isfinite(margin)):
        return None
    if abs(diff) >= margin:
        return None
    if sd == 0:
        return _exact_floor(a, 1.0)  # TOST p = 2^-n for identical differences inside the margin
    return _search(lambda n: power_tost(n, diff, sd, margin, a), None)


def sd_from_interval(lo: float, hi: float, n: int, level: float = 0.95) -> float:
    """The sd of n paired differences from their two-sided Student t interval (lo, hi) at ``level``:
    half-width = t_{(1+level)/2, n-1} sd / sqrt(n), inverted. nan for n < 2 or a missing interval."""
    if n < 2 or not (math.isfinite(lo) and math.isfinite(hi)):
        return float("nan")
    return (hi - lo) / 2 / float(sps.t.ppf(0.5 + level / 2, n - 1)) * math.sqrt(n)


@dataclass(frozen=True)
class SeedPlan:
    """The next block's seeds for one primary cell: ``n_difference`` and ``n_equivalence`` (None: no n
    up to MAX_N reaches 80% power at the observed effect), from ``diff``, ``sd`` over ``n`` seeds."""

    diff: float
    sd: float
    n: int
    family: int
    margin: float | None
    n_difference: int | None
    n_equivalence: int | None


def plan_cell(diff: float, sd: float, n: int, family: int, margin: float | None, alpha: float = ALPHA) -> SeedPlan:
    """Both plans for one cell observed with mean difference ``diff`` and sd ``sd`` over ``n`` pairs."""
    return SeedPlan(
        diff, sd, n, family, margin,
        seeds_for_difference(diff, sd, family, alpha),
        seeds_for_equivalence(diff, sd, margin, family, alpha),
    )  # fmt: skip

"""Stall and collapse, measured: declared rules on a run's curves (pure functions, no torch).

Two curves, two rules, each with its constants declared here and in docs/outputs.md (``curve/*`` keys of
``summary.json``; the aggregator's ``curve_*`` and ``val_pass1_auc`` columns read the same functions).

**Plateau of the held-out curve.** The curve is held-out pass@1 (``val/pass@1``; ``val/success_sampled``,
the same number, in a row without it) at every evaluation the run logged, the base's at step 0 included,
in step order. Over the trailing window of the last ``PLATEAU_WINDOW`` (5) evaluations, fit pass@1 = a +
b * step by ordinary least squares; the slope's two-sided ``PLATEAU_LEVEL`` (95%) Student t interval is
b ± t(0.975, W - 2) * se(b), se(b) = sqrt(SSR / (W - 2) / Sxx) (an exact fit has se = 0). The window is
**plateaued** when both hold:

1. the rise is not significant: the interval's lower bound is <= 0 (a one-sided test of b > 0 at 2.5%
   does not reject "no rise"), and
2. the rise is not material: the fitted rise across the window, b * (last step - first step), is below
   ``PLATEAU_MIN_GAIN`` (0.02 pass@1).

(1) alone would call a rising curve flat whenever the held-out noise is large (at W = 5 a window must rise
by ~2.5 noise standard deviations to be significant); (2) alone would call a noise-free flat stretch
after a rise "rising" only until the rise leaves the window, but would also read a lucky noise spike
as growth. Together: "no evidence of improvement, and no material estimated improvement". An
equivalence rule (plateaued when the *upper* bound of the rise is below the gain) was considered and not
chosen: at W = 5 its noise floor is ~4 noise standard deviations of one evaluation (0.04-0.08 pass@1 at
this bench's held-out sizes), so it would never fire on a real curve.

``curve/plateaued`` is the rule on the last window; ``curve/steps_to_plateau`` is the step of the last
evaluation of the first window on which it holds (None when it never does); ``curve/slope_last``,
``curve/slope_lo``, ``curve/slope_hi`` are b and its interval on the last window (pass@1 per RL step).
Fewer than W evaluations: every plateau key is None.

**Entropy collapse.** The curve is the per-step ``entropy`` of the metrics rows (mean per-token
entropy of the rollout's samples, nats), non-finite values skipped. Its reference level E0 is the median
of the first ``COLLAPSE_INIT_STEPS`` (10) finite values. After them, each step's level is the median of
the trailing ``COLLAPSE_SMOOTH`` (25) finite values (the reference window's among them while it is
that close): a single step's entropy is noisy (at beta 0.5 in the prolonged pilot it swings between 0.30
and 0.65 around a steady 0.42, which unsmoothed thresholds count as 17 "events"), a collapse is a
sustained fall. A
collapse **event** starts at the first step whose level is below ``COLLAPSE_ENTER`` x E0 (0.5) while no
event is open, and the event closes at the first later step whose level is at or above
``COLLAPSE_EXIT`` x E0 (0.75): hysteresis, so a curve that hovers around one threshold counts once.
``curve/collapse_events`` counts the events (one still open
at the end included), ``curve/first_collapse_step`` is the step the first one starts (None without one),
``curve/entropy_ref`` is E0. Fewer than ``COLLAPSE_INIT_STEPS + 1`` finite values, or E0 <= 0: all
three are None (no reference level to fall from).

**Area under the held-out curve.** ``curve/val_pass1_auc``: the trapezoidal area under the held-out
pass@1 curve (the same points as the plateau rule) divided by the step span: a time-averaged pass@1,
comparable across runs of different length (one evaluation: its value).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

PLATEAU_WINDOW = 5  # evaluations in the trailing window of the plateau rule
PLATEAU_LEVEL = 0.95  # two-sided level of the slope's Student t interval
PLATEAU_MIN_GAIN = 0.02  # pass@1: a fitted rise across the window below this is not material
COLLAPSE_INIT_STEPS = 10  # steps whose median entropy is the reference level E0
COLLAPSE_ENTER = 0.5  # an event starts below this fraction of E0
COLLAPSE_EXIT = 0.75  # ... and closes at or above this fraction of E0 (hysteresis)
COLLAPSE_SMOOTH = 25  # steps in the trailing median the thresholds apply to (1: the raw per-step values)

PASS1 = "val/pass@1"
PASS1_FALLBACK = "val/success_sampled"  # the same number (mean success of all samples); present in every row


@dataclass(frozen=True)
class SlopeFit:
    """OLS slope of values on steps over one window, with its two-sided t interval."""

    slope: float  # per step
    lo: float
    hi: float
    span: float  # last step - first step of the window

    @property
    def rise(self) -> float:
        """The fitted rise across the window (slope x span)."""
        return self.slope * self.span


@cache
def _t_quantile(q: float, df: int) -> float:
    from scipy import stats  # a core dependency; imported only when a rule runs

    return float(stats.t.ppf(q, df))


def fit_slope(steps: Sequence[float], values: Sequence[float], level: float = PLATEAU_LEVEL) -> SlopeFit:
    """Least-squares slope of ``values`` on ``steps`` and its two-sided ``level`` t interval (df = n - 2).
    Needs >= 3 points with distinct steps (ValueError otherwise)."""
    n = len(steps)
    if n != len(values):
        raise ValueError(f"fit_slope: {n} steps but {len(values)} values")
    if n < 3:
        raise ValueError(f"fit_slope: {n} points; an interval needs at least 3")
    if not 0 < level < 1:
        raise ValueError(f"fit_slope: level={level} must be in (0, 1)")
    xs, ys = [float(s) for s in steps], [float(v) for v in values]
    if not all(math.isfinite(v) for v in (*xs, *ys)):
        raise ValueError(f"fit_slope: non-finite input (steps {xs}, values {ys})")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        raise ValueError(f"fit_slope: the steps {xs} do not vary")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ssr = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    se = math.sqrt(ssr / (n - 2) / sxx)
    half = _t_quantile(0.5 + level / 2, n - 2) * se
    return SlopeFit(slope=b, lo=b - half, hi=b + half, span=xs[-1] - xs[0])


def is_plateau(fit: SlopeFit, min_gain: float = PLATEAU_MIN_GAIN) -> bool:
    """The plateau rule on one window: the rise is neither significant (lower bound <= 0) nor material
    (fitted rise across the window < ``min_gain``)."""
    return fit.lo <= 0.0 and fit.rise < min_gain


def _check_steps(steps: Sequence[float], what: str) -> None:
    bad = [(a, b) for a, b in zip(steps, steps[1:]) if not b > a]
    if bad:
        raise ValueError(f"{what}: steps must be strictly increasing, got {bad[0][0]} then {bad[0][1]}")


def plateau(
    steps: Sequence[float],
    values: Sequence[float],
    window: int = PLATEAU_WINDOW,
    level: float = PLATEAU_LEVEL,
    min_gain: float = PLATEAU_MIN_GAIN,
) -> dict[str, Any]:
    """The plateau rule along a held-out curve (one value per evaluation, steps increasing): the last
    window's slope, interval and verdict, and the first window's last step on which the rule holds."""
    if window < 3:
        raise ValueError(f"plateau: window={window} must be >= 3 (a t interval needs df >= 1)")
    _check_steps(steps, "plateau")
    out: dict[str, Any] = {"slope_last": None, "slope_lo": None, "slope_hi": None, "plateaued": None,
                           "steps_to_plateau": None}  # fmt: skip
    if len(steps) < window:
        return out
    first = None
    fit = None
    for end in range(window, len(steps) + 1):
        fit = fit_slope(steps[end - window : end], values[end - window : end], level)
        if first is None and is_plateau(fit, min_gain):
            first = steps[end - 1]
    assert fit is not None
    out.update(slope_last=fit.slope, slope_lo=fit.lo, slope_hi=fit.hi, plateaued=is_plateau(fit, min_gain),
               steps_to_plateau=first)  # fmt: skip
    return out


def collapse_events(
    steps: Sequence[float],
    entropy: Sequence[float | None],
    init_steps: int = COLLAPSE_INIT_STEPS,
    enter: float = COLLAPSE_ENTER,
    leave: float = COLLAPSE_EXIT,
    smooth: int = COLLAPSE_SMOOTH,
) -> dict[str, Any]:
    """Entropy-collapse events with hysteresis (module docstring): count, first start step, E0."""
    if not 0 < enter < leave:
        raise ValueError(f"collapse_events: need 0 < enter ({enter}) < leave ({leave})")
    if init_steps < 1 or smooth < 1:
        raise ValueError(f"collapse_events: init_steps={init_steps} and smooth={smooth} must be >= 1")
    if len(steps) != len(entropy):
        raise ValueError(f"collapse_events: {len(steps)} steps but {len(entropy)} values")
    _check_steps(steps, "collapse_events")
    pts = [(s, float(e)) for s, e in zip(steps, entropy) if e is not None and math.isfinite(float(e))]
    none = {"collapse_events": None, "first_collapse_step": None, "entropy_ref": None}
    if len(pts) <= init_steps:
        return none
    e0 = _median([e for _, e in pts[:init_steps]])
    if e0 <= 0:
        return none
    events, first, open_ = 0, None, False
    values = [v for _, v in pts]
    for i in range(init_steps, len(pts)):
        s, e = pts[i][0], _median(values[max(0, i - smooth + 1) : i + 1])
        if not open_ and e < enter * e0:
            events, open_ = events + 1, True
            first = s if first is None else first
        elif open_ and e >= leave * e0:
            open_ = False
    return {"collapse_events": events, "first_collapse_step": first, "entropy_ref": e0}


def _median(values: Sequence[float]) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def held_out_auc(steps: Sequence[float], values: Sequence[float]) -> float | None:
    """Trapezoidal area under the held-out curve divided by its step span (one point: its value;
    none: None)."""
    _check_steps(steps, "held_out_auc")
    if not steps:
        return None
    if len(steps) == 1:
        return float(values[0])
    area = sum((s1 - s0) * (v0 + v1) / 2.0 for s0, s1, v0, v1 in zip(steps, steps[1:], values, values[1:]))
    return area / (steps[-1] - steps[0])


def pass1(row: dict[str, Any]) -> float:
    """Held-out pass@1 of one validation row: ``val/pass@1``, else ``val/success_sampled`` (equal)."""
    for key in (PASS1, PASS1_FALLBACK):  # a table of rows (pandas) holds NaN where a row lacks a key
        value = row.get(key)
        if value is not None and not math.isnan(float(value)):
            return float(value)
    raise KeyError(f"validation row at step {row.get('step')} has neither {PASS1} nor {PASS1_FALLBACK}")


def curve_summary(history: Sequence[dict[str, Any]], val_rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``curve/*`` keys of ``summary.json`` from the metrics rows and the validation rows."""
    vs = [r["step"] for r in val_rows]
    vy = [pass1(r) for r in val_rows]
    p = plateau(vs, vy)
    c = collapse_events([r["step"] for r in history], [r.get("entropy") for r in history])
    return {
        **{f"curve/{k}": v for k, v in p.items()},
        **{f"curve/{k}": v for k, v in c.items()},
        "curve/val_pass1_auc": held_out_auc(vs, vy),
    }

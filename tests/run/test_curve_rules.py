"""The plateau, entropy-collapse and held-out-area rules (prorl_bench/run/curve_rules.py) on synthetic
curves whose answers are worked out by hand."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from prorl_bench.run import curve_rules as cr

T975_DF3 = 3.182446305284263  # Student t, 97.5% quantile, 3 degrees of freedom (W = 5)


def test_fit_slope_matches_the_textbook_interval():
    # x = 0, 1, 2, 3, 4; y = 0, 1, 1, 1, 1 (one rise at the start): b = Sxy / Sxx = 2 / 10,
    # SSR = 0.4, se = sqrt(0.4 / 3 / 10)
    fit = cr.fit_slope([0, 1, 2, 3, 4], [0, 1, 1, 1, 1])
    se = math.sqrt(0.4 / 3 / 10)
    assert fit.slope == pytest.approx(0.2)
    assert fit.lo == pytest.approx(0.2 - T975_DF3 * se)
    assert fit.hi == pytest.approx(0.2 + T975_DF3 * se)
    assert fit.span == 4 and fit.rise == pytest.approx(0.8)
    exact = cr.fit_slope([10, 20, 30], [1.0, 2.0, 3.0])  # an exact fit: a zero-width interval
    assert exact.slope == pytest.approx(0.1) and exact.hi - exact.lo == pytest.approx(0.0, abs=1e-12)


def test_a_linear_rising_curve_never_plateaus():
    steps = list(range(0, 1001, 25))
    p = cr.plateau(steps, [0.05 + 0.0005 * s for s in steps])  # +0.05 pass@1 per 100-step window
    assert p["plateaued"] is False and p["steps_to_plateau"] is None
    assert p["slope_last"] == pytest.approx(0.0005) and p["slope_lo"] > 0


def test_a_curve_that_saturates_plateaus_at_the_first_window_after_it():
    # evaluations every 10 steps, the curve rises 0.005 per step (0.05 per evaluation) until S = 120,
    # then stays flat. A window with >= 2 rising intervals rises significantly; the window whose only
    # rise is its first interval (x = 0..4 in evaluations: y = 0, c, c, c, c) has a fitted rise of 0.8 c
    # = 0.04 >= 0.02 and is not a plateau either; the first window entirely at or after S (steps 120..160)
    # is flat: slope 0, interval [0, 0], a plateau. Its last step is 160.
    steps = list(range(0, 301, 10))
    p = cr.plateau(steps, [0.1 + 0.005 * min(s, 120) for s in steps])
    assert p["steps_to_plateau"] == 160
    assert p["plateaued"] is True and p["slope_last"] == 0.0


def test_a_gentle_saturation_plateaus_one_window_earlier():
    # the same shape rising 0.002 per step (c = 0.02 per evaluation): the one-rise window (110..150) has a
    # fitted rise 0.8 c = 0.016 < 0.02 and its interval's lower bound 0.2 c / 10 - t * se < 0, so
    # it is already a plateau: the answer is 150, one evaluation before the flat window's 160
    steps = list(range(0, 301, 10))
    p = cr.plateau(steps, [0.1 + 0.002 * min(s, 120) for s in steps])
    assert p["steps_to_plateau"] == 150


def test_a_noisy_flat_curve_plateaus_and_a_noisy_rising_one_does_not():
    steps = list(range(0, 401, 25))
    rng = random.Random(0)
    noise = [rng.gauss(0.0, 0.01) for _ in steps]
    flat = cr.plateau(steps, [0.4 + e for e in noise])
    assert flat["plateaued"] is True
    assert flat["steps_to_plateau"] == 100  # the first full window (steps 0..100)
    assert flat["slope_lo"] <= 0 <= flat["slope_hi"]
    rising = cr.plateau(steps, [0.1 + 0.001 * s + e for s, e in zip(steps, noise)])  # +0.1 per 100 steps
    assert rising["plateaued"] is False and rising["steps_to_plateau"] is None


def test_a_slow_but_steady_rise_is_not_a_plateau():
    # +0.01 per 100-step window (below the 0.02 material gain) without noise: significant (lo > 0), so
    # "no evidence of improvement" does not hold
    steps = list(range(0, 501, 25))
    p = cr.plateau(steps, [0.3 + 0.0001 * s for s in steps])
    assert p["slope_lo"] > 0 and p["plateaued"] is False and p["steps_to_plateau"] is None


def test_a_falling_curve_is_a_plateau_not_growth():
    steps = list(range(0, 201, 20))
    p = cr.plateau(steps, [0.8 - 0.001 * s for s in steps])
    assert p["plateaued"] is True and p["steps_to_plateau"] == 80 and p["slope_hi"] < 0


def test_plateau_needs_a_full_window_and_increasing_steps():
    assert cr.plateau([0, 25, 50, 75], [0.1, 0.2, 0.3, 0.4]) == dict.fromkeys(
        ("slope_last", "slope_lo", "slope_hi", "plateaued", "steps_to_plateau")
    )
    with pytest.raises(ValueError, match="strictly increasing"):
        cr.plateau([0, 25, 25, 50, 75], [0.1] * 5)
    with pytest.raises(ValueError, match="window"):
        cr.plateau([0, 1, 2], [0, 0, 0], window=2)


def test_collapse_events_count_with_hysteresis():
    # E0 = 1.0 (steps 1..10); enter below 0.5, close at >= 0.75:
    # 13 enters (0.45), 14-16 stay open (0.49, 0.7, 0.74 < 0.75), 17 closes (0.8); 18 enters (0.3),
    # 20 closes (0.76); 21 enters (0.4) and stays open to the end: 3 events, the first at step 13
    ent = [1.0] * 10 + [0.9, 0.6, 0.45, 0.49, 0.7, 0.74, 0.8, 0.3, 0.2, 0.76, 0.4] + [0.3] * 19
    c = cr.collapse_events(list(range(1, 41)), ent, smooth=1)
    assert c == {"collapse_events": 3, "first_collapse_step": 13, "entropy_ref": 1.0}


def test_hovering_at_the_threshold_is_one_event():
    # 0.45 / 0.55 alternate around 0.5 x E0 but never reach 0.75 x E0: one open event, not five
    c = cr.collapse_events(list(range(1, 21)), [1.0] * 10 + [0.45, 0.55] * 5, smooth=1)
    assert c["collapse_events"] == 1 and c["first_collapse_step"] == 11


def test_the_thresholds_read_a_trailing_median_not_single_steps():
    # E0 = 1.0; steps 11-70 cycle 0.55 / 0.3 / 0.8 (every third step below 0.5 x E0, every third at or above
    # 0.75 x E0): raw values open and close an event each cycle (20), the trailing median of 25 is 0.55 or
    # more throughout (no collapse). From step 71 on a sustained 0.1: the window of step 71 + j holds j + 1
    # of them and 24 - j cycle values, among them the 0.3s of steps 48, 51, ..., 69 still inside; the median
    # (13th smallest) is <= 0.3 once (j + 1) + #0.3s >= 13: j = 0..5 give 9, 10, 10, 11, 12, 12; j = 6 gives
    # 7 + 6 = 13: the event starts at step 77
    ent = [1.0] * 10 + [0.55, 0.3, 0.8] * 20 + [0.1] * 40
    steps = list(range(1, 111))
    assert cr.collapse_events(steps[:70], ent[:70], smooth=1)["collapse_events"] == 20
    assert cr.collapse_events(steps[:70], ent[:70])["collapse_events"] == 0
    first = next(s for i, s in enumerate(steps) if i >= 10 and statistics.median(ent[max(0, i - 24) : i + 1]) < 0.5)
    assert first == 77  # the enumeration agrees with the count above
    c = cr.collapse_events(steps, ent)
    assert c["collapse_events"] == 1 and c["first_collapse_step"] == first


def test_collapse_reference_is_the_median_and_no_collapse_means_zero():
    steps = list(range(1, 31))
    head = [2.0, 0.1, 2.4, 1.8, 9.0, 2.2, 2.1, 1.9, 1.6, 2.3]  # median (2.0 + 2.1) / 2 (outliers ignored)
    c = cr.collapse_events(steps, head + [1.1] * 20, smooth=1)  # above 0.5 x E0 = 1.025: no event
    assert c == {"collapse_events": 0, "first_collapse_step": None, "entropy_ref": pytest.approx(2.05)}
    c = cr.collapse_events(steps, head + [0.99] + [None, float("nan")] * 9 + [0.5], smooth=1)  # gaps skipped
    assert c["collapse_events"] == 1 and c["first_collapse_step"] == 11


def test_collapse_reference_of_an_odd_window_is_its_middle_value():
    c = cr.collapse_events(list(range(1, 8)), [0.1, 3.0, 2.0, 9.0, 1.0, 0.9, 0.95], init_steps=5, smooth=1)
    assert c["entropy_ref"] == 2.0 and c["collapse_events"] == 1 and c["first_collapse_step"] == 6


def test_collapse_needs_a_reference_window():
    assert cr.collapse_events(list(range(1, 11)), [1.0] * 10)["collapse_events"] is None
    assert cr.collapse_events(list(range(1, 21)), [0.0] * 20)["entropy_ref"] is None  # E0 = 0: nothing to fall
    with pytest.raises(ValueError, match="enter"):
        cr.collapse_events([1, 2], [1.0, 1.0], enter=0.8, leave=0.5)


def test_held_out_auc():
    assert cr.held_out_auc([0, 10, 30], [0.0, 1.0, 1.0]) == pytest.approx((5 + 20) / 30)
    assert cr.held_out_auc([5], [0.3]) == 0.3 and cr.held_out_auc([], []) is None


def test_curve_summary_reads_pass1_and_entropy_rows():
    val = [{"step": s, "val/pass@1": 0.1 + 0.005 * min(s, 120)} for s in range(0, 301, 10)]
    val[3] = {"step": 30, "val/success_sampled": val[3]["val/pass@1"]}  # eval.ks without 1
    hist = [{"step": s, "entropy": 1.0 if s <= 20 else 0.2} for s in range(1, 41)]
    out = cr.curve_summary(hist, val)
    assert out["curve/steps_to_plateau"] == 160 and out["curve/plateaued"] is True
    # the trailing median of 25 first drops below 0.5 at step 33: steps 9-33, 13 of its 25 values are 0.2
    assert out["curve/collapse_events"] == 1 and out["curve/first_collapse_step"] == 33
    assert out["curve/val_pass1_auc"] == pytest.approx((120 * (0.1 + 0.7) / 2 + 180 * 0.7) / 300)  # 0.58
    with pytest.raises(KeyError, match="val/pass@1"):
        cr.pass1({"step": 5})


def test_a_runs_summary_holds_the_curve_keys_of_its_own_files(run_exp):
    import json

    from prorl_bench.run.outputs import read_jsonl

    summary, d = run_exp(["steps=12", "eval_every=2"], name="curves")  # 7 evaluations, 12 entropy values
    on_disk = json.loads((d / "summary.json").read_text())
    expected = cr.curve_summary(read_jsonl(d / "metrics.jsonl"), read_jsonl(d / "validation.jsonl"))
    assert {k: on_disk[k] for k in expected} == expected
    assert isinstance(on_disk["curve/plateaued"], bool) and on_disk["curve/slope_lo"] <= on_disk["curve/slope_hi"]
    assert on_disk["curve/collapse_events"] is not None and on_disk["curve/entropy_ref"] > 0

"""Evaluation that sees coverage: pass@k against brute force, per-prompt diversity, the per-difficulty
breakdown, samples.jsonl, the base at step 0, kl/base — and none of it may touch the training trajectory."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from prorl_bench.config import ConfigError
from prorl_bench.run.outputs import read_jsonl
from prorl_bench.run.passk import distinct_per_prompt, mean_pass_at_k, pass_at_k
from tests.conftest import make_config, strip_timing


def _brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    """Fraction of all k-subsets of the samples that contain at least one success."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_brute_force_enumeration(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(outcomes, k), abs=1e-12)
            assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_1_is_the_success_rate_and_pass_at_k_is_monotone():
    by_prompt = [[True, False, False, False], [False] * 4, [True] * 4, [False, True, True, False]]
    assert mean_pass_at_k(by_prompt, 1) == pytest.approx(sum(map(sum, by_prompt)) / 16)
    vals = [mean_pass_at_k(by_prompt, k) for k in range(1, 5)]
    assert vals == sorted(vals) and vals[-1] == 0.75  # 3 of 4 prompts solved at least once
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_distinct_per_prompt_counts_within_a_prompt_not_across():
    collapsed = [["a", "a", "a"], ["b", "b", "b"]]  # every prompt: one answer (unique across prompts!)
    diverse = [["a", "b", "c"], ["a", "a", "d"]]
    assert distinct_per_prompt(collapsed) == 1.0
    assert distinct_per_prompt(diverse) == 2.5


def test_eval_config_is_validated():
    with pytest.raises(ConfigError, match="eval.ks"):
        make_config(["eval.n_samples=4", "eval.ks=[1,8]"])
    with pytest.raises(ConfigError, match="eval.n_samples"):
        make_config(["eval.n_samples=0", "eval.ks=[1]"])


EVAL = ["eval.n_samples=4", "eval.ks=[1,2,4]", "eval.n_sample_prompts=3"]


def test_validation_rows_samples_and_the_base_at_step_0(run_exp):
    summary, d = run_exp(EVAL, name="ev")
    val = read_jsonl(d / "validation.jsonl")
    assert [v["step"] for v in val] == [0, 3, 6]  # the base, then every eval_every, and the end
    for v in val:
        assert v["val/pass@1"] == pytest.approx(v["val/success_sampled"])
        assert v["val/pass@1"] <= v["val/pass@2"] <= v["val/pass@4"]
        assert 1.0 <= v["val/distinct_per_prompt"] <= 4.0 and v["val/entropy"] >= 0
        labels = {k.split("/")[2] for k in v if k.startswith("val/by_difficulty/")}
        assert labels == {"len3", "len4", "len5"}  # reverse_digits' default lengths 3..5
    samples = read_jsonl(d / "samples.jsonl")
    # every held-out prompt (task.val_size=16) at the base and the final step; eval.n_sample_prompts between
    assert [s["step"] for s in samples] == [0] * 16 + [3] * 3 + [6] * 16
    s = samples[0]
    assert len(s["samples"]) == 4 and s["difficulty"] == f"len{len(s['target'])}"
    assert all(x["success"] == (x["completion"] == s["target"]) for x in s["samples"])
    assert summary["final_val"]["step"] == 6
    for step in (0, 6):
        _assert_validation_row_recomputes_from_samples(val[[v["step"] for v in val].index(step)], samples, step)


def _assert_validation_row_recomputes_from_samples(row: dict, samples: list[dict], step: int) -> None:
    """Audit: a reader holding only samples.jsonl gets the validation row's pass@k, success, greedy
    success, distinct completions and per-difficulty figures back to 1e-9 (pass@k by the closed form
    1 - C(n-c, k) / C(n, k), independently of prorl_bench.run.passk)."""
    rows = [r for r in samples if r["step"] == step]

    def pass_k(rs: list[dict], k: int) -> float:
        vals = []
        for r in rs:
            n, c = len(r["samples"]), sum(x["success"] for x in r["samples"])
            vals.append(1 - math.comb(n - c, k) / math.comb(n, k))
        return sum(vals) / len(vals)

    for k in (1, 2, 4):
        assert abs(pass_k(rows, k) - row[f"val/pass@{k}"]) < 1e-9, (step, k)
    every = [x for r in rows for x in r["samples"]]
    assert abs(sum(x["success"] for x in every) / len(every) - row["val/success_sampled"]) < 1e-9
    assert abs(sum(x["reward"] for x in every) / len(every) - row["val/reward_mean"]) < 1e-9
    assert abs(sum(r["greedy_success"] for r in rows) / len(rows) - row["val/success_greedy"]) < 1e-9
    distinct = sum(len({x["completion"] for x in r["samples"]}) for r in rows) / len(rows)
    assert abs(distinct - row["val/distinct_per_prompt"]) < 1e-9
    for label in {r["difficulty"] for r in rows}:
        part = [r for r in rows if r["difficulty"] == label]
        assert abs(pass_k(part, 4) - row[f"val/by_difficulty/{label}/pass@4"]) < 1e-9


def test_evaluation_settings_do_not_touch_the_training_trajectory(run_exp):
    _, a = run_exp(EVAL, name="a")
    _, b = run_exp(["eval.n_samples=8", "eval.ks=[1,8]", "eval.at_start=false", "eval.batch=5"], name="b")
    rows = [strip_timing(read_jsonl(d / "metrics.jsonl")) for d in (a, b)]
    assert rows[0] == rows[1]
    assert read_jsonl(b / "validation.jsonl")[0]["step"] == 3  # no base row when at_start=false


def test_kl_base_is_kl_ref_without_resets_and_measured_for_c(run_exp):
    _, a1 = run_exp(EVAL, name="a1")
    rows = read_jsonl(a1 / "metrics.jsonl")
    assert all(r["kl/base"] == r["kl/ref"] for r in rows)
    _, b = run_exp([*EVAL, "variant=B"], name="b")
    assert all(r["kl/base"] is None for r in read_jsonl(b / "metrics.jsonl"))  # NaN in JSON: null
    # C, first reset after step 4: at the step-3 evaluation the reference still is the base
    _, c = run_exp([*EVAL, "variant=C", "reset=periodic", "reset.every=4"], name="c")
    rows = {r["step"]: r for r in read_jsonl(c / "metrics.jsonl")}
    assert rows[3]["kl/base"] == pytest.approx(rows[3]["kl/ref"], rel=1e-6)
    assert rows[6]["kl/base"] is not None and rows[5]["kl/base"] is None  # measured at evaluations only
    assert rows[6]["kl/base"] != pytest.approx(rows[6]["kl/ref"])  # the reference moved at step 4


def test_resume_keeps_one_copy_of_every_validation_and_sample_row(run_exp):
    import shutil

    knobs = [*EVAL, "checkpoint.every=3"]
    _, full = run_exp(knobs, name="full")
    part = full.parent / "part"
    shutil.copytree(full, part)
    for ckpt in (part / "checkpoints").glob("step_00000006*"):
        ckpt.unlink()  # as if killed after step 5: resume from the step-3 checkpoint
    (part / "summary.json").unlink()
    run_exp(knobs, name="part")
    for name in ("validation.jsonl", "samples.jsonl"):
        assert [json.dumps(r, sort_keys=True) for r in read_jsonl(full / name)] == [
            json.dumps(r, sort_keys=True) for r in read_jsonl(part / name)
        ]


def test_extending_a_finished_run_equals_running_it_longer_from_the_start(run_exp):
    """The end-of-run evaluation (step 5 of a 5-step run, not a multiple of eval_every) must not feed
    the stall trigger: extending 5 -> 8 steps then gives the 8-step run's trajectory and resets."""
    knobs = [*EVAL, "experiment=prorl_v1", "reset.patience=1", "eval_every=2", "checkpoint.every=1"]
    _, direct = run_exp([*knobs, "steps=8"], name="direct")
    run_exp([*knobs, "steps=5"], name="extended")
    _, extended = run_exp([*knobs, "steps=8"], name="extended")

    def resets(d):
        return [(e["step"], e["reason"]) for e in read_jsonl(d / "events.jsonl") if e["event"] == "reset"]

    assert resets(direct), "the test needs a stall reset to happen"
    assert resets(extended) == resets(direct)
    assert strip_timing(read_jsonl(extended / "metrics.jsonl")) == strip_timing(read_jsonl(direct / "metrics.jsonl"))


def test_the_end_of_run_report_shows_real_completions_and_the_paths(run_exp):
    from prorl_bench.cli.app import final_report

    summary, d = run_exp(EVAL, name="report")
    text = final_report(d, summary)
    last = [r for r in read_jsonl(d / "samples.jsonl") if r["step"] == 6]
    assert f"{last[0]['prompt']!r} → want {last[0]['target']!r}" in text
    assert "pass@4" in text and str(d / "summary.json") in text


def test_endpoint_evaluations_take_their_own_sample_size(run_exp):
    """eval.endpoint_n_samples / endpoint_ks apply to the base (step 0) and the final evaluation only; the
    evaluations between them keep n_samples / ks, and the coverage classes (against the base's per-prompt
    counts) are computed only where the sample sizes match (the final step)."""
    import json

    _, d = run_exp(["eval.n_samples=2", "eval.ks=[1,2]", "eval.endpoint_n_samples=8", "eval.endpoint_ks=[1,4,8]"])
    rows = {r["step"]: r for r in map(json.loads, (d / "validation.jsonl").read_text().splitlines())}
    assert sorted(rows) == [0, 3, 6]
    for step in (0, 6):
        assert {"val/pass@1", "val/pass@4", "val/pass@8"} <= set(rows[step]) and "val/pass@2" not in rows[step]
    assert "val/pass@2" in rows[3] and "val/pass@8" not in rows[3]
    assert not any(k.startswith("val/coverage") for k in rows[3])
    assert any(k.startswith("val/coverage@8") for k in rows[6])
    samples = [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]
    n_per_prompt = {s["step"]: len(s["samples"]) for s in samples}
    assert n_per_prompt[0] == n_per_prompt[6] == 8 and n_per_prompt[3] == 2

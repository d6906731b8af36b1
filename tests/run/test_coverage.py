"""Coverage at large k: pass@k up to k = n = 1024 against exact rational arithmetic, the Invisible Leash
classes against brute-force enumeration of k-subsets, and a run whose final validation row's classes
recompute from samples.jsonl (the base's and the final step's samples) — also after a resume."""

from __future__ import annotations

import itertools
import math
import shutil
from fractions import Fraction

import pytest

from prorl_bench.config import ConfigError
from prorl_bench.run.outputs import read_jsonl
from prorl_bench.run.passk import coverage_classes, pass_at_k
from tests.conftest import make_config


def _exact(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


@pytest.mark.parametrize("n", [256, 1024])
def test_pass_at_k_at_large_k_matches_exact_rationals(n: int) -> None:
    for c in (0, 1, 2, 5, n // 2, n - 256, n - 1, n):
        for k in (1, 2, 16, 64, 128, 255, 256):
            if k > n or c < 0:
                continue
            assert pass_at_k(n, c, k) == pytest.approx(float(_exact(n, c, k)), rel=1e-12, abs=1e-15), (n, c, k)
    # closed forms: one correct sample -> k/n; pass@n is 1 iff any sample is correct
    assert pass_at_k(n, 1, 256) == pytest.approx(256 / n, rel=1e-12)
    assert pass_at_k(n, 0, n) == 0.0 and pass_at_k(n, 1, n) == 1.0


def test_k_above_the_samples_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match="eval.n_samples"):
        pass_at_k(128, 3, 256)
    with pytest.raises(ConfigError, match="eval.ks"):
        make_config(["eval.n_samples=128", "eval.ks=[1,256]"])


def _brute_classes(base: list[bool], trained: list[bool], k: int) -> dict[str, Fraction]:
    """Every pair (k-subset of the base's samples, k-subset of the trained policy's): which class."""
    counts = dict.fromkeys(("both", "base_only", "trained_only", "neither"), 0)
    pairs = 0
    for sb in itertools.combinations(base, k):
        for st in itertools.combinations(trained, k):
            b, t = any(sb), any(st)
            counts["both" if b and t else "base_only" if b else "trained_only" if t else "neither"] += 1
            pairs += 1
    return {name: Fraction(v, pairs) for name, v in counts.items()}


def test_coverage_classes_equal_brute_force_enumeration() -> None:
    # four prompts, n = 5 samples each; correct counts chosen to cover every class
    base_c, trained_c, n = [0, 1, 3, 5], [2, 0, 5, 1], 5
    for k in range(1, n + 1):
        per_prompt = [
            _brute_classes([True] * b + [False] * (n - b), [True] * t + [False] * (n - t), k)
            for b, t in zip(base_c, trained_c)
        ]
        got = coverage_classes(base_c, n, trained_c, n, k)
        assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
        for name in got:
            want = sum(p[name] for p in per_prompt) / len(per_prompt)
            assert got[name] == pytest.approx(float(want), abs=1e-12), (k, name)
    # at k = n the classes are counts: prompt 0 trained only, 1 base only, 2 and 3 both
    assert coverage_classes(base_c, n, trained_c, n, n) == {
        "both": 0.5, "base_only": 0.25, "trained_only": 0.25, "neither": 0.0,
    }  # fmt: skip
    with pytest.raises(ValueError, match="same prompts"):
        coverage_classes([1, 2], 5, [1], 5, 2)


EVAL = ["eval.n_samples=8", "eval.ks=[1,8]", "eval.n_sample_prompts=2", "checkpoint.every=3"]


def _classes_from_samples(samples: list[dict], step: int, k: int) -> dict[str, float]:
    """Independently of passk: per prompt, the closed form for each side, then the class products."""
    base = {r["prompt"]: r for r in samples if r["step"] == 0}
    out = dict.fromkeys(("both", "base_only", "trained_only", "neither"), 0.0)
    rows = [r for r in samples if r["step"] == step]
    for r in rows:
        pk = []
        for side in (base[r["prompt"]], r):
            n, c = len(side["samples"]), sum(x["success"] for x in side["samples"])
            pk.append(1 - math.comb(n - c, k) / math.comb(n, k))
        b, t = pk
        out["both"] += b * t / len(rows)
        out["base_only"] += b * (1 - t) / len(rows)
        out["trained_only"] += (1 - b) * t / len(rows)
        out["neither"] += (1 - b) * (1 - t) / len(rows)
    return out


def test_final_coverage_classes_recompute_from_samples_and_survive_a_resume(run_exp) -> None:
    _, full = run_exp(EVAL, name="full")
    val = read_jsonl(full / "validation.jsonl")
    assert not any(key.startswith("val/coverage") for key in val[0])  # the base row: nothing to compare
    final = val[-1]
    want = _classes_from_samples(read_jsonl(full / "samples.jsonl"), final["step"], 8)
    for name, value in want.items():
        assert abs(final[f"val/coverage@8/{name}"] - value) < 1e-9, name
    part = full.parent / "part"
    shutil.copytree(full, part)
    for ckpt in (part / "checkpoints").glob("step_00000006*"):
        ckpt.unlink()  # as if killed after step 5: resume from the step-3 checkpoint (base counts inside)
    (part / "summary.json").unlink()
    run_exp(EVAL, name="part")
    resumed = read_jsonl(part / "validation.jsonl")[-1]
    assert {k: v for k, v in resumed.items() if k.startswith("val/coverage")} == {
        k: v for k, v in final.items() if k.startswith("val/coverage")
    }


def test_the_aggregator_tables_the_coverage_classes(tmp_path, capsys) -> None:
    """Two arms x 3 seeds with known final-row classes: runs.csv holds them, the printed table shows
    them, and each class is compared with the baseline (descriptive: no study here)."""
    import pandas as pd

    from prorl_bench.sweeps import aggregate as agg
    from tests.sweep_factory import metric_rows, write_run

    classes = {"A1": (0.6, 0.1, 0.1, 0.2), "C": (0.6, 0.0, 0.2, 0.2)}  # both, base only, trained only, neither
    for arm, (both, shrink, expand, neither) in classes.items():
        for seed in range(3):
            final = {"step": 10, "val/pass@1": 0.5, "val/pass@256": 0.8, "val/coverage@256/both": both,
                     "val/coverage@256/base_only": shrink, "val/coverage@256/trained_only": expand,
                     "val/coverage@256/neither": neither}  # fmt: skip
            write_run(tmp_path, [f"variant={arm}", f"seed={seed}"], metrics=metric_rows([0.5] * 10),
                      validation=[{"step": 0, "val/pass@1": 0.3, "val/pass@256": 0.7}, final],
                      summary={"status": "completed", "steps_completed": 10},
                      config={"seed": seed, "task": {"name": "t"}})  # fmt: skip
    assert agg.main([str(tmp_path), "--no-figures", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "solved: base only" in out and "solved: trained only" in out
    runs = pd.read_csv(tmp_path / "out" / "runs.csv")
    c = runs[runs["group"] == "C"]
    assert (c["cov_shrink_final"] == 0.0).all() and (c["cov_expand_final"] == 0.2).all()
    cmp = pd.read_csv(tmp_path / "out" / "comparisons.csv").set_index(["group", "metric"])
    assert cmp.loc[("C", "cov_shrink_final"), "diff"] == pytest.approx(-0.1)
    assert cmp.loc[("C", "cov_expand_final"), "diff"] == pytest.approx(0.1)

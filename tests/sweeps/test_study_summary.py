"""The compact study summary (``prorl-bench-report --summary``) holds what the verdict table needs: the
cells recomputed from it equal the aggregator's own primary cells, and a corrupt file is refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prorl_bench.sweeps.aggregate import aggregate
from prorl_bench.sweeps.study_summary import (
    SummaryError,
    build_summary,
    comparisons_from_summary,
    load_summary,
    stratum_of,
    write_summary,
)
from tests.sweep_factory import metric_rows, write_run

STUDY = {
    "question": "Does the transform change success?",
    "primary": [{"metric": "success_final", "direction": "higher", "margin": 0.03},
                {"metric": "reward_auc", "direction": "higher", "margin": 0.05}],
    "baseline": "keep",
    "blocks": {"explore": "range(0,8)", "confirm": "range(8,16)"},
}  # fmt: skip
OK = {
    "status": "completed",
    "steps_completed": 10,
    "wall_time_s": 12.5,
    "provenance": {
        "bench": {"commit": "abc1234def", "dirty": False},
        "command": ["prorl-bench-sweep", "+sweep=toy", "algo.lr=1e-3", "+transform=keep,hard,soft"],
        "machine": {"cpu_model": "Test CPU", "cpu_count": 2},
    },
}
REPORT = str(Path(sys.executable).with_name("prorl-bench-report"))  # the installed entry point


def _block(d: Path, seeds, block: str) -> Path:
    effects = {"keep": lambda s: 0.0, "hard": lambda s: -0.1 + 0.01 * (s % 3), "soft": lambda s: 0.004 * (-1) ** s}
    for seed in seeds:
        level = 0.3 + 0.05 * (seed % 7)
        for arm, effect in effects.items():
            cfg = {"seed": seed, "task": {"name": "t"}, "study": {**STUDY, "block": block}}
            rewards = [level + effect(seed) * (i + 1) / 10 for i in range(10)]  # AUC and final differ
            write_run(
                d, [f"+transform={arm}", f"seed={seed}"] + ([f"study.block={block}"] if block != "explore" else []),
                metrics=metric_rows(rewards), summary=OK, config=cfg,
            )  # fmt: skip
    return d


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    return (_block(root / "explore" / "2026-01-01_00-00-00", range(8), "explore"),
            _block(root / "confirm" / "2026-01-01_01-00-00", range(8, 16), "confirm"))  # fmt: skip


def test_cells_from_the_summary_equal_the_aggregators(blocks, tmp_path):
    res = aggregate(list(blocks), tmp_path / "agg", figures=False)
    summary = build_summary(res)
    mine = comparisons_from_summary(load_summary(write_summary(summary, tmp_path / "s.json")))
    theirs = res.comparisons[res.comparisons["family"] == "primary"]
    assert len(mine) == len(theirs) == 2 * 2 * 2  # 2 arms x 2 endpoints x 2 blocks
    key = ["block", "group", "metric"]
    merged = mine.merge(theirs, on=key, suffixes=("", "_agg"))
    assert len(merged) == len(mine)
    for col in ("diff", "lo", "hi", "p", "p_holm", "p_equiv", "p_equiv_holm", "n"):
        assert merged[col].tolist() == pytest.approx(merged[f"{col}_agg"].tolist(), nan_ok=True), col
    assert merged["verdict"].tolist() == merged["verdict_agg"].tolist()
    assert set(merged.loc[merged["group"] == "hard", "verdict"]) == {"different"}


def test_the_summary_names_its_study_and_provenance(blocks, tmp_path):
    s = build_summary(aggregate(list(blocks), tmp_path / "agg", figures=False))
    assert s["study"] == "toy" and s["stratum"] == "algo.lr=1e-3" and s["baseline"] == "keep"
    explore = s["blocks"]["explore"]
    assert explore["seeds"] == list(range(8)) and len(explore["runs"]) == 24
    assert explore["provenance"]["commits"] == ["abc1234def"] and explore["provenance"]["machine"] == "Test CPU, 2 CPUs"
    assert explore["provenance"]["run_s"] == 24 * 12.5 and explore["provenance"]["started"] == "2026-01-01 00:00 UTC"


def test_a_stratum_the_command_does_not_name_is_labelled_from_the_command_line(blocks, tmp_path):
    out = tmp_path / "s.json"
    subprocess.run([REPORT, "--summary", str(out), "--name", "prolonged", "--stratum", "beta=0.5", *map(str, blocks)],
                   cwd=tmp_path, check=True, capture_output=True)  # fmt: skip
    s = load_summary(out)
    assert (s["study"], s["stratum"]) == ("prolonged", "beta=0.5")


def test_the_stratum_leaves_out_where_and_how_a_sweep_ran():
    cmd = "prorl-bench-sweep +sweep=reset_map algo.lr=1e-3 model=small study.block=confirm hydra.launcher.n_jobs=2"
    cmd += " +arm=a,b"
    assert stratum_of(cmd) == "algo.lr=1e-3 model=small"


@pytest.mark.parametrize(
    "text, said",
    [("{not json", "not a readable study summary"), ('{"schema": "other"}', "expected 'prorl-bench/study-summary/1'"),
     ('{"schema": "prorl-bench/study-summary/1", "study": "x"}', "missing key 'stratum'"),
     ('{"schema": "prorl-bench/study-summary/1", "x": NaN}', "non-finite number NaN")],
)  # fmt: skip
def test_a_corrupt_summary_is_refused_by_name(tmp_path, text, said):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(SummaryError, match="bad.json") as e:
        load_summary(path)
    assert said in str(e.value)


def test_the_entry_point_writes_a_summary_and_the_page(blocks, tmp_path):
    studies = tmp_path / "docs" / "data" / "studies"
    out = subprocess.run([REPORT, "--summary", str(studies / "toy.json"), *map(str, blocks)],
                         capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads((studies / "toy.json").read_text())["schema"] == "prorl-bench/study-summary/1"
    assert not any((b / "aggregate").exists() for b in blocks)  # the sweeps' own aggregate is left alone
    (tmp_path / "docs" / "results.md").write_text("stale\n")
    check = subprocess.run([REPORT, "--docs", "--check"], capture_output=True, text=True, cwd=tmp_path)
    assert check.returncode == 1 and "differs" in check.stdout  # a stale page is caught, nothing written
    assert (tmp_path / "docs" / "results.md").read_text() == "stale\n"
    assert subprocess.run([REPORT, "--docs"], capture_output=True, text=True, cwd=tmp_path).returncode == 0
    page = (tmp_path / "docs" / "results.md").read_text()
    assert "## `toy` · `algo.lr=1e-3`" in page and "→ different (worse)" in page and "replicated" in page
    assert subprocess.run([REPORT, "--docs", "--check"], capture_output=True, text=True, cwd=tmp_path).returncode == 0
    (studies / "bad.json").write_text("{}")
    bad = subprocess.run([REPORT, "--docs"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "bad.json" in bad.stderr

"""prorl-bench-map: strata of one study read together; each stratum aggregated as prorl-bench-aggregate
EXPLORE CONFIRM would, its primary cells collected with verdict and replication, a figure drawn."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from prorl_bench.sweeps.study_map import main, strata_layout, verdict_word
from tests.sweep_factory import metric_rows, write_run

STUDY = {
    "question": "Does the transform change success?",
    "primary": [{"metric": "success_final", "direction": "higher", "margin": 0.03}],
    "baseline": "keep",
    "blocks": {"explore": "range(0,8)", "confirm": "range(8,16)"},
}
OK = {"status": "completed", "steps_completed": 10}
MAP = str(Path(sys.executable).with_name("prorl-bench-map"))  # the installed entry point, as a user runs it


def _block(d, seeds, effects, block):
    for seed in seeds:
        level = 0.3 + 0.05 * (seed % 7)
        for arm, effect in effects.items():
            cfg = {"seed": seed, "task": {"name": "t"}, "study": {**STUDY, "block": block}}
            write_run(
                d, [f"+transform={arm}", f"seed={seed}"] + ([f"study.block={block}"] if block != "explore" else []),
                metrics=metric_rows([level + effect(seed)] * 10), summary=OK, config=cfg,
            )  # fmt: skip


def test_the_map_collects_verdicts_and_replication_per_stratum(tmp_path):
    root = tmp_path / "reset_map"
    harm = {"keep": lambda s: 0.0, "hard": lambda s: -0.1, "soft": lambda s: 0.004 * (-1) ** s}
    _block(root / "lr0.001" / "explore" / "2026-01-01_00-00-00", range(8), harm, "explore")
    _block(root / "lr0.001" / "confirm" / "2026-01-01_01-00-00", range(8, 16), harm, "confirm")
    _block(root / "lr0.0001" / "explore" / "2026-01-01_00-00-00", range(8), harm, "explore")  # one block only
    out = subprocess.run([MAP, str(root)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    cells = pd.read_csv(root / "map.csv")
    hard = cells[(cells["stratum"] == "lr0.001") & (cells["group"] == "hard")]
    assert set(hard["block"]) == {"explore", "confirm"} and (hard["verdict"] == "different").all()
    assert (hard["replication"] == "replicated").all() and hard["diff"].tolist() == pytest.approx([-0.1, -0.1])
    soft = cells[(cells["stratum"] == "lr0.001") & (cells["group"] == "soft")]
    assert (soft["replication"] == "replicated (equivalent in both)").all()
    assert (cells[cells["stratum"] == "lr0.0001"]["replication"] == "one block").all()
    assert "→ worse (n=8)" in out.stdout and "not run" in out.stdout  # the missing confirm block is said
    assert (root / "map.png").stat().st_size > 0 and (root / "lr0.001" / "aggregate" / "seed_plan.csv").exists()


def test_an_empty_root_fails_loudly(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2  # in-process: the entry point's own function (the subprocess test above)
    assert "no <stratum>/explore|confirm/<date>" in capsys.readouterr().err


def test_verdict_words_follow_the_direction():
    assert verdict_word("different", -0.1, "higher") == "worse"
    assert verdict_word("different", -0.1, "lower") == "better"
    assert verdict_word("equivalent", 0.01, "higher") == "equivalent"
    assert verdict_word("", 0.0, "higher") == "undecided"


def test_a_stratum_still_running_is_refused_not_left_out(tmp_path):
    """A stratum whose sweep has runs without a final status is named and the map exits 2: leaving it
    out (the map once printed the finished strata only and exited 0) presents a partial map as the map."""
    root = tmp_path / "reset_map"
    harm = {"keep": lambda s: 0.0, "hard": lambda s: -0.1}
    _block(root / "lr0.001" / "explore" / "2026-01-01_00-00-00", range(8), harm, "explore")
    running = root / "lr0.0003" / "explore" / "2026-01-01_00-00-00"
    _block(running, range(8), harm, "explore")
    for summary in sorted(running.glob("*/summary.json"))[:3]:
        summary.unlink()  # three runs still training: no summary yet
    out = subprocess.run([MAP, str(root)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2, out.stdout
    assert "lr0.0003" in out.stderr and "3 incomplete of 16 runs" in out.stderr and "--resume" in out.stderr
    assert not (root / "map.csv").exists()


def test_strata_named_by_one_pattern_are_laid_out_as_panels():
    """The reset map's names (lr<x>_every<y>_d<z>): x by the lr's value (not its text: 1.0e-05 < 0.0001),
    panel columns by cadence, rows by size; names without one shared pattern are drawn in one row."""
    layout = strata_layout(["lr0.001_every10_d64", "lr1.0e-05_every10_d64", "lr0.0001_every20_d128",
                            "lr0.0003_every10_d128"])  # fmt: skip
    assert layout == {
        "lr0.001_every10_d64": (0, 0, 3),
        "lr1.0e-05_every10_d64": (0, 0, 0),
        "lr0.0001_every20_d128": (1, 1, 1),
        "lr0.0003_every10_d128": (1, 0, 2),
    }
    assert strata_layout(["lr0.001", "lr0.0001"]) is None  # one token: one row, as before
    assert strata_layout(["lr0.001_every10", "lr0.001_d64"]) is None  # two patterns

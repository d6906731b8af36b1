"""Every config key has help text, and `prorl-bench --help` shows it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from prorl_bench.confhelp import _class_comments, field_help


def test_every_config_key_has_help_text():
    missing = [key for key, (_, text) in field_help().items() if not text]
    assert missing == [], f"config fields without a comment in prorl_bench/config.py: {missing}"


def test_comment_extraction_reads_same_line_and_block_above():
    @dataclasses.dataclass
    class Toy:
        a: int = 1  # same line
        # block line one
        # block line two
        b: int = 2
        c: int = 3

    assert _class_comments(Toy) == {"a": "same line", "b": "block line one block line two"}


def test_help_lists_groups_and_keys():
    out = subprocess.run(
        [sys.executable, "-m", "prorl_bench.app", "--help"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "opt_reset: asym, hard, keep, soft" in out
    assert "algo.eps_high = 0.28  # PPO clip" in out and "warmup.seed = 0" in out

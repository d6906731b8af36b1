"""benchmarks/bench_vs_trl.py's offline pieces: the padded tokenizer and the side settings."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("transformers")
_spec = importlib.util.spec_from_file_location(
    "bench_vs_trl", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_vs_trl.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_padded_tokenizer_has_the_requested_size_and_keeps_the_task_text():
    small, big = bench.padded_tokenizer(None), bench.padded_tokenizer(151_936)
    assert len(small) == 192 and len(big) == 151_936
    text = "[BOS]R123456="
    assert big(text)["input_ids"] == small(text)["input_ids"]  # prompts are the same ids
    assert big.decode(big("654321")["input_ids"]) == "654321"
    assert big.convert_ids_to_tokens(151_935) == f"[unused{151_935 - 192}]"
    with pytest.raises(SystemExit, match="at least 192"):
        bench.padded_tokenizer(100)


def test_sides_carry_known_settings_only():
    assert bench.parse_side("prorl_fast@decode=dynamic+update_norm=device+adamw=foreach") == (
        "prorl_fast", {"decode": "dynamic", "update_norm": "device", "adamw": "foreach"}
    )  # fmt: skip
    assert bench.parse_side("trl") == ("trl", {})
    for bad in ("trl@decode=static", "prorl_fast@speed=max", "prorl_turbo"):
        with pytest.raises(SystemExit):
            bench.parse_side(bad)


def test_sizes_match_qwen25_05b():
    s = bench.SIZES["0.5b"]
    assert (s["family"], s["hidden"], s["layers"], s["heads"], s["kv_heads"], s["mlp"], s["tied"], s["vocab"]) == (
        "qwen2", 896, 24, 14, 2, 4864, True, "151936"
    )  # fmt: skip

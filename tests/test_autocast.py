"""bf16 autocast in the update: every minibatch's forward must see the weights the previous
optimizer step left. ``torch.autocast`` caches its casts of the weights until the context exits
(keyed by tensor, not by version), so an optimizer step inside the context leaves the later
minibatches on the weights from before the step — silently. The trainer enters autocast around each
minibatch's forwards and loss only; these tests run the CUDA path's structure with CPU bf16 autocast."""

from __future__ import annotations

import json

import pytest
import torch


def test_torch_autocast_reuses_stale_weight_casts():
    """The mechanism itself (if torch ever stops caching, the guard below stays harmless)."""
    lin, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = lin(x)
        with torch.no_grad():
            lin.weight.add_(1.0)
        after = lin(x)
    assert torch.equal(before, after)  # the second forward used the cached cast of the old weight


def _bf16_rows(monkeypatch, run_exp, cache: bool, name: str) -> list[dict]:
    import prorl_bench.trainer as trainer

    real = trainer.setup_hardware

    def cpu_bf16(cfg, threads):
        device, _ = real(cfg, threads)
        return device, torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache)

    monkeypatch.setattr(trainer, "setup_hardware", cpu_bf16)
    _, run_dir = run_exp(["steps=3", "algo.ppo_epochs=2", "algo.minibatches=2", "algo.lr=3e-3"], name)
    monkeypatch.setattr(trainer, "setup_hardware", real)
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("variant", ["A1", "B"])
def test_update_under_autocast_equals_uncached_casts(variant, monkeypatch, run_exp):
    """With the cache on (what CUDA runs) the trajectory must equal one where every forward casts
    the current weights afresh (cache off): bit for bit, 4 optimizer steps per RL step."""
    from .conftest import strip_timing

    cached = _bf16_rows(monkeypatch, lambda o, n: run_exp([*o, f"variant={variant}"], n), True, "cached")
    fresh = _bf16_rows(monkeypatch, lambda o, n: run_exp([*o, f"variant={variant}"], n), False, "fresh")
    assert strip_timing(cached) == strip_timing(fresh)
    assert any(r["kl/old"] > 0 for r in cached)  # minibatches 2-4 saw moved weights (stale casts: exactly 0)

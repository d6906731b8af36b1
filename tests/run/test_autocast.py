"""bf16 autocast in the update: every minibatch's forward must see the weights the previous
optimizer step left. ``torch.autocast`` caches its casts of the weights until the context exits
(keyed by tensor, not by version), so an optimizer step inside the context leaves the later
minibatches on the weights from before the step — silently. The trainer enters autocast around each
minibatch's forwards and loss only; these tests run the CUDA path's structure with CPU bf16 autocast."""

from __future__ import annotations

import json

import pytest
import torch

from prorl_bench.run.hardware import setup_hardware as REAL_SETUP


def test_torch_autocast_reuses_stale_weight_casts():
    """The mechanism itself. Should a torch release stop reusing stale casts, this test fails and the
    per-minibatch autocast scope in the trainer becomes a precaution rather than a fix."""
    lin, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = lin(x)
        with torch.no_grad():
            lin.weight.add_(1.0)
        after = lin(x)
    assert torch.equal(before, after)  # the second forward used the cached cast of the old weight


def _bf16_rows(monkeypatch, run_exp, variant: str, cache: bool) -> list[dict]:
    """A short run whose update runs under CPU bf16 autocast (the CUDA path's structure)."""
    import prorl_bench.run.setup as setup

    def cpu_bf16(cfg, threads):
        device, _ = REAL_SETUP(cfg, threads)
        return device, torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache)

    monkeypatch.setattr(setup, "setup_hardware", cpu_bf16)
    over = ["steps=3", "algo.ppo_epochs=2", "algo.minibatches=2", "algo.lr=3e-3", f"variant={variant}"]
    _, run_dir = run_exp(over, f"cache_{cache}")
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("variant", ["A1", "B"])
def test_update_under_autocast_equals_uncached_casts(variant, monkeypatch, run_exp):
    """With the cache on (what CUDA runs) the trajectory must equal one where every forward casts
    the current weights afresh (cache off): bit for bit, 4 optimizer steps per RL step."""
    from tests.conftest import strip_timing

    cached = _bf16_rows(monkeypatch, run_exp, variant, cache=True)
    fresh = _bf16_rows(monkeypatch, run_exp, variant, cache=False)
    assert strip_timing(cached) == strip_timing(fresh)
    assert any(r["kl/old"] > 0 for r in cached)  # minibatches 2-4 saw moved weights (stale casts: exactly 0)


def test_mfu_peak_is_measured_in_the_runs_matmul_precision():
    """MFU divides by a peak of the precision the matmuls run in: bf16 under CUDA autocast (an fp32
    peak would understate a bf16 run's headroom several-fold), fp32 everywhere else."""
    from prorl_bench.run.accounting import _PEAK_CACHE, measured_matmul_peak
    from prorl_bench.run.hardware import matmul_dtype
    from tests.conftest import make_config

    cfg = make_config(["hardware=auto", "hardware.dtype=bf16"])
    assert matmul_dtype(cfg, torch.device("cuda")) == torch.bfloat16
    assert matmul_dtype(cfg, torch.device("cpu")) == torch.float32  # auto on a CPU host: no autocast
    assert matmul_dtype(make_config(["hardware=auto"]), torch.device("cuda")) == torch.float32
    cpu = torch.device("cpu")
    fp32, bf16 = measured_matmul_peak(cpu, n=64), measured_matmul_peak(cpu, torch.bfloat16, n=64)
    assert fp32 > 0 and bf16 > 0
    threads = torch.get_num_threads()
    assert {f"cpu:{torch.float32}:{threads}", f"cpu:{torch.bfloat16}:{threads}"} <= set(_PEAK_CACHE)  # one per dtype

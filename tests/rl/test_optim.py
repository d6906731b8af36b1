"""optim.py: the AdamW implementation by device, and the update_norm snapshot modes."""

from __future__ import annotations

import json
import math

import pytest
import torch

from prorl_bench.config import AdamWImpl, AlgoConfig, UpdateNormMode
from prorl_bench.rl.optim import ParamSnapshot, adamw_impl, build_adamw, update_norm_mode
from tests.conftest import strip_timing


def _train(impl: str, steps: int = 6):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.GELU(), torch.nn.Linear(48, 8))
    opt = build_adamw(list(m.parameters()), AlgoConfig(lr=1e-2, weight_decay=0.01, adamw_impl=AdamWImpl(impl)))
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        loss = m(torch.randn(32, 16, generator=g)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in m.parameters()], opt


def test_fused_and_foreach_adamw_agree_to_rounding_on_cpu():
    (a, fa), (b, fb) = _train("foreach"), _train("fused")
    assert fa.defaults["foreach"] and not fa.defaults["fused"] and fb.defaults["fused"]
    for x, y in zip(a, b):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6)  # measured max |diff| ~3e-8
    sa, sb = fa.state_dict()["state"], fb.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(set(sa[k]) == set(sb[k]) == {"step", "exp_avg", "exp_avg_sq"} for k in sa)


def test_adamw_impl_is_chosen_by_device():
    assert adamw_impl("auto", torch.device("cuda")) == AdamWImpl.fused
    assert adamw_impl("auto", torch.device("cpu")) == AdamWImpl.foreach  # CPU trajectories bit-identical
    assert adamw_impl("fused", torch.device("cpu")) == AdamWImpl.fused
    assert adamw_impl("foreach", torch.device("cuda")) == AdamWImpl.foreach
    (a, _), (b, _) = _train("auto"), _train("foreach")
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_update_norm_modes_by_device():
    assert update_norm_mode("auto", torch.device("cuda")) == UpdateNormMode.host
    assert update_norm_mode("auto", torch.device("cpu")) == UpdateNormMode.device
    assert update_norm_mode("off", torch.device("cuda")) == UpdateNormMode.off


def test_snapshot_norm_is_exact_in_device_and_host_modes_and_host_reuses_its_buffers():
    torch.manual_seed(0)
    params = [torch.randn(5, 7), torch.randn(3), torch.randn(2, 2, 2)]
    before = [p.clone() for p in params]
    snaps = {m: ParamSnapshot(params, m) for m in ("device", "host", "off")}
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn_like(p) * 0.1)
    want = math.sqrt(sum(float(((p.double() - b.double()) ** 2).sum()) for p, b in zip(params, before)))
    got = {m: s.norm(params) for m, s in snaps.items()}
    assert got["device"] == got["host"] and math.isclose(got["device"], want, rel_tol=1e-12)
    assert math.isnan(got["off"]) and snaps["off"].copies == []
    assert all(c.untyped_storage().data_ptr() != p.untyped_storage().data_ptr()
               for c, p in zip(snaps["host"].copies, params))  # fmt: skip
    again = ParamSnapshot(params, "host")  # the same host buffers, refilled
    assert all(x is y for x, y in zip(again.copies, snaps["host"].copies))
    assert again.norm(params) == 0.0


def _rows(d):
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_update_norm_modes_in_training(run_exp):
    """host = device bit for bit (same per-tensor sums), off logs NaN and changes nothing else."""
    common = ["steps=3", "eval_every=100", "eval.at_start=false"]
    _, dev = run_exp([*common, "hardware.update_norm=device"], "dev")
    _, host = run_exp([*common, "hardware.update_norm=host"], "host")
    _, off = run_exp([*common, "hardware.update_norm=off"], "off")
    d, h, o = (strip_timing(_rows(x)) for x in (dev, host, off))
    assert d == h and any(r["update_norm"] > 0 for r in d)  # 0 where a step had no signal (zero gradients)
    assert all(r["update_norm"] is None for r in o)  # NaN, written as null in metrics.jsonl
    assert [{k: v for k, v in r.items() if k != "update_norm"} for r in o] == [
        {k: v for k, v in r.items() if k != "update_norm"} for r in d
    ]

"""The KL that triggers a reset is one measurement on both engines: native's ``diagnostics.step_kl`` and
TRL's ``BenchRunCallback.step_kl`` both call ``run/kl_measure.reference_kl``, and on the same log-probs
they give the same ``KLStats`` — TRL's from the rows its loss saw on the RL step's first pass over its
batch (split into minibatches, later PPO epochs ignored, processes padded to different widths)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from prorl_bench.config import LossAgg  # noqa: E402
from prorl_bench.engines.trl.kl_rows import KLRows  # noqa: E402
from prorl_bench.engines.trl.rundir import BenchRunCallback  # noqa: E402
from prorl_bench.engines.trl.trainer import BenchGRPOTrainer  # noqa: E402
from prorl_bench.rl.kl import build_kl  # noqa: E402
from prorl_bench.run import diagnostics, kl_measure  # noqa: E402
from tests.conftest import make_config  # noqa: E402

B, L = 8, 6


def _logps(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, L, generator=g) * 3
    ref = old + 0.3 * torch.randn(B, L, generator=g)
    mask = (torch.rand(B, L, generator=g) > 0.2).float()
    mask[:, 0] = 1.0
    return old, ref, mask


def _native(cfg, old, ref, mask) -> object:
    """Native's step_kl on a rollout whose reference log-probs are ``ref`` (every row trained)."""
    ctx = SimpleNamespace(kl=build_kl(cfg.kl_estimator), cfg=cfg)
    s = SimpleNamespace(ref=SimpleNamespace(exists=True, is_base=True))
    sc = SimpleNamespace(batch=SimpleNamespace(completion_mask=mask))
    upd = SimpleNamespace(means=lambda: {"kl/old": 0.25}, ref_rows=ref)
    return diagnostics.step_kl(ctx, s, sc, old, upd, torch.arange(B))


def _trl(cfg, old, ref, mask, spg=2, iterations=2) -> object:
    """TRL's path: BenchGRPOTrainer._record_kl on each compute_loss of one RL step (``spg`` minibatches x
    ``iterations`` epochs; later epochs see a moved policy), then BenchRunCallback.step_kl."""
    args = SimpleNamespace(steps_per_generation=spg, num_iterations=iterations)
    trainer = SimpleNamespace(args=args, ref_source="cached", diag_agg=LossAgg.token, bench_kl_old=[],
                              bench_kl_rows=KLRows(), bench_loss_calls=0)  # fmt: skip
    per = B // spg
    for it in range(iterations):
        for i in range(spg):
            rows = slice(i * per, (i + 1) * per)
            width = L - i  # minibatches padded to their own width (as processes are): trailing columns masked
            o, r, m = old[rows].clone(), ref[rows].clone(), mask[rows].clone()
            m[:, width:] = 0
            moved = o + 0.5 * it  # a later epoch: the policy has moved (ignored by the KL to the reference)
            trainer.bench_loss_logps = moved[:, :width]
            inputs = {"completion_ids": torch.zeros(per, width), "completion_mask": m[:, :width],
                      "old_per_token_logps": None if spg * iterations == 1 else moved[:, :width],
                      "ref_per_token_logps": r[:, :width]}  # fmt: skip
            BenchGRPOTrainer._record_kl(trainer, inputs)
    cb = SimpleNamespace(kl=build_kl(cfg.kl_estimator), cfg=cfg, resets=SimpleNamespace(resets=[]),
                         trainer=SimpleNamespace(ref_source="cached"))  # fmt: skip
    measured = {"trainer": {"kl/old": 0.25, "kl_rows": trainer.bench_kl_rows}}
    return BenchRunCallback.step_kl(cb, 1, measured)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("agg", ["token", "sequence", "seq_mean_token_sum"])
def test_both_engines_measure_the_same_kl_from_the_same_logprobs(estimator, agg):
    over = [f"kl_estimator={estimator}", f"algo.loss_agg={agg}"]
    if estimator == "k1":
        over.append("kl_estimator.placement=reward")
    cfg = make_config(over)
    old, ref, mask = _logps(0)
    for i in range(2):  # the masked tail of each minibatch, as TRL pads it
        mask[i * B // 2 : (i + 1) * B // 2, L - i :] = 0
    native, trl = _native(cfg, old, ref, mask), _trl(cfg, old, ref, mask)
    assert math.isfinite(native.ref) and native.ref != 0
    assert trl.ref == pytest.approx(native.ref, rel=1e-6, abs=1e-9)
    assert trl.ref_k1 == pytest.approx(native.ref_k1, rel=1e-6, abs=1e-9)
    assert trl.k2_ref_over_old == pytest.approx(native.k2_ref_over_old, rel=1e-6, abs=1e-9)
    assert (trl.old, trl.base) == (native.old, trl.ref)


def test_without_a_pi_old_pass_the_loss_logprobs_are_pi_old():
    """One minibatch, one epoch: TRL computes no old_per_token_logps and the loss's log-probs are pi_old's."""
    cfg = make_config([])
    old, ref, mask = _logps(1)
    assert _trl(cfg, old, ref, mask, spg=1, iterations=1).ref == pytest.approx(_native(cfg, old, ref, mask).ref)


def test_both_engines_call_the_one_measurement(monkeypatch):
    calls = []
    real = kl_measure.reference_kl

    def spy(*a, **k):
        calls.append(a)
        return real(*a, **k)

    import prorl_bench.engines.trl.rundir as rundir

    monkeypatch.setattr(diagnostics, "reference_kl", spy)
    monkeypatch.setattr(rundir, "reference_kl", spy)
    cfg = make_config([])
    old, ref, mask = _logps(2)
    _native(cfg, old, ref, mask)
    _trl(cfg, old, ref, mask)
    assert len(calls) == 2

"""optim.py: the AdamW implementation by device, and the update_norm snapshot modes."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from prorl_bench.config import AdamWImpl, AlgoConfig, UpdateNormMode
from prorl_bench.rl import optim
from prorl_bench.rl.optim import NORM_CHUNK, ParamSnapshot, adamw_impl, build_adamw, update_norm_mode
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


class _LargestNewTensor(TorchDispatchMode):
    """The bytes of the largest tensor any op creates (a new storage: views and in-place results of
    existing tensors do not count) while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = [*args, *(kwargs or {}).values()]
        inputs = {a.untyped_storage().data_ptr() for a in flat if isinstance(a, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def _integer_step(shapes: list[tuple[int, ...]]) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """Weights with integer values and an update by integers: every difference is exact in fp32 and
    the squared norm is an integer below 2^53, so the fp64 sums have one right answer."""
    g = torch.Generator().manual_seed(3)
    before = [torch.randint(-1000, 1000, s, generator=g).float() for s in shapes]
    steps = [torch.randint(-50, 51, s, generator=g) for s in shapes]
    exact = sum(int((d.long() ** 2).sum()) for d in steps)  # Python integers: no rounding at all
    return [b + d for b, d in zip(before, steps)], before, exact


@pytest.mark.parametrize("mode", ["device", "host"])
def test_snapshot_norm_streams_bounded_pieces_and_is_exact(mode):
    """A weight of 2 x NORM_CHUNK + 5 elements: no temporary larger than the fp64 work buffer of
    NORM_CHUNK elements (the whole-tensor form made fp64 copies of the whole weight: 2.7 GB for a
    0.5B model's embedding on the GPU), and the norm equals the exact integer closed form."""
    shapes = [(2, NORM_CHUNK + 2), (1,), (3, 7, 5), (1, 3)]
    after, before, exact = _integer_step(shapes)
    snap = ParamSnapshot(before, mode)
    with _LargestNewTensor() as probe:
        got = snap.norm(after)
    assert got == math.sqrt(exact)
    assert probe.largest <= NORM_CHUNK * 8  # whole form: (2 * NORM_CHUNK + 4) * 8 bytes


def test_snapshot_norm_pieces_of_any_size_give_the_same_metric_and_host_equals_device():
    torch.manual_seed(0)
    shapes = [(37, 41), (3,), (2, 2, 2), (), (1000,)]
    after, before, exact = _integer_step(shapes)
    snaps = {m: ParamSnapshot(before, m) for m in ("device", "host")}
    for chunk in (1, 7, 64, 1000, 1517, NORM_CHUNK):
        with _LargestNewTensor() as probe:
            got = {m: s.norm(after, chunk) for m, s in snaps.items()}
        assert got["device"] == got["host"] == math.sqrt(exact), chunk
        pieces = sum(-(-t.numel() // chunk) for t in after)
        assert probe.largest <= 8 * max(chunk, pieces), chunk  # the fp64 work buffer, or the pieces' sums
    rnd = [torch.randn(s) for s in shapes]  # random values: host == device bit for bit at every chunk,
    moved = [r + 1e-3 * torch.randn_like(r) for r in rnd]  # both equal to the fp64 brute force
    want = math.sqrt(sum(float(((m.double() - r.double()) ** 2).sum()) for m, r in zip(moved, rnd)))
    for chunk in (1, 7, 64, NORM_CHUNK):
        dev, host = ParamSnapshot(rnd, "device").norm(moved, chunk), ParamSnapshot(rnd, "host").norm(moved, chunk)
        assert dev == host and math.isclose(dev, want, rel_tol=1e-12), chunk
    with pytest.raises(ValueError, match="chunk"):
        snaps["device"].norm(after, 0)


def test_snapshot_host_copy_comes_back_one_piece_at_a_time(monkeypatch):
    """The host snapshot reaches the weights' device in pieces of at most ``chunk`` elements, never a
    whole tensor (on a GPU each piece is one pinned host-to-device copy; tests/test_gpu.py bounds the
    CUDA memory)."""
    seen: list[int] = []
    real = optim._squared_diff

    def spy(p, b, work):
        seen.append(b.numel())
        assert b.device.type == "cpu" and p.numel() == b.numel() <= work.numel()
        return real(p, b, work)

    monkeypatch.setattr(optim, "_squared_diff", spy)
    after, before, exact = _integer_step([(40, 30), (7,)])
    assert ParamSnapshot(before, "host").norm(after, 256) == math.sqrt(exact)
    assert seen == [256] * 4 + [176, 7]  # 1200 = 4 x 256 + 176, then the 7-element tensor


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


@pytest.mark.slow
def test_gradients_are_freed_after_the_update(run_exp, monkeypatch):
    """No gradient outlives its update: the rollout, the log-prob passes and validation of the next
    step see none (kept, the last minibatch's would hold one parameter-sized copy through them)."""
    from prorl_bench.run import trainer

    seen: list[bool] = []

    def watch(real):
        def wrapped(ctx, s, *args, **kwargs):
            seen.append(any(p.grad is not None for p in s.policy.parameters()))
            return real(ctx, s, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(trainer, "rollout", watch(trainer.rollout))
    monkeypatch.setattr(trainer, "validate_phase", watch(trainer.validate_phase))
    summary, _ = run_exp(["steps=3", "eval_every=1", "eval.at_start=false"], "grads")
    assert len(seen) == 6 and not any(seen)  # 3 rollouts + 3 validations

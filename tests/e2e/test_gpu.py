"""GPU paths on an HF model: bf16 autocast with every variant, a reset, LoRA growth, resume and
export. Skipped without CUDA (CI and the development VM have none; see the README for whether they
were run on a lent GPU)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import make_config, strip_timing

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

GPU = ["hardware=cuda", "hardware.dtype=bf16", "model=hf_causal_lm", "algo.prompts_per_step=2",
       "algo.group_size=4", "eval.n_samples=2", "eval.ks=[1,2]", "task.val_size=4", "eval_every=2"]  # fmt: skip


def _rows(d):
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("variant", ["A0", "A1", "A2", "B", "C"])
def test_every_variant_runs_in_bf16_on_cuda(variant, tiny_hf_dir, tmp_path):
    from prorl_bench.run.trainer import train

    extra = ["reset=periodic", "reset.every=2"] if variant == "C" else []
    cfg = make_config([*GPU, f"model.path={tiny_hf_dir}", f"variant={variant}", "steps=4", *extra])
    summary = train(cfg, tmp_path / "run", tmp_path / "cache")
    assert summary["status"] == "completed" and summary["resets"] == (2 if variant == "C" else 0)
    assert summary["mem/cuda_max_allocated_mb"] > 0


def test_lora_growth_resume_and_export_on_cuda(tiny_hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from prorl_bench.run.export import export_run, load_run
    from prorl_bench.run.trainer import train

    over = [*GPU, f"model.path={tiny_hf_dir}", "variant=C", "reset=periodic", "reset.every=2", "adapter=lora",
            "adapter.targets=[q_proj,v_proj]", "growth=rank", "growth.grow_every=2", "growth.max_rank=8"]  # fmt: skip
    train(make_config([*over, "steps=4"]), tmp_path / "full", tmp_path / "cache")
    train(make_config([*over, "steps=2"]), tmp_path / "part", tmp_path / "cache")
    train(make_config([*over, "steps=4"]), tmp_path / "part", tmp_path / "cache")
    assert strip_timing(_rows(tmp_path / "full")) == strip_timing(_rows(tmp_path / "part"))
    out = export_run(tmp_path / "full", tmp_path / "export")
    policy, tok, _, _ = load_run(tmp_path / "full")
    ids = torch.tensor([tok.encode("R123=")])
    with torch.no_grad():
        ours = policy.hf(input_ids=ids).logits
        theirs = AutoModelForCausalLM.from_pretrained(out).eval()(input_ids=ids).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_auto_impl_is_the_fast_path_on_cuda(tiny_hf_dir):
    """impl=auto picks the forward measured faster on a GPU (docs/performance.md), and it matches
    HF's forward there in bf16 autocast."""
    from prorl_bench.config import HFImpl, ModelConfig, ModelKind
    from prorl_bench.models.fast_llama import FastLlamaPolicy
    from prorl_bench.models.hf_model import load_policy

    dev = torch.device("cuda")
    auto = load_policy(ModelConfig(kind=ModelKind.hf_causal_lm, path=str(tiny_hf_dir)), dev)
    hf = load_policy(ModelConfig(kind=ModelKind.hf_causal_lm, path=str(tiny_hf_dir), impl=HFImpl.hf), dev)
    assert isinstance(auto, FastLlamaPolicy)
    ids = torch.randint(3, 90, (4, 12), device=dev)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        mask = torch.ones_like(ids, dtype=torch.bool)
        a, b = auto(ids, mask).float(), hf(ids, mask).float()
    assert (a - b).norm() / b.norm() < 2e-2  # bf16 operands: ~1e-3..1e-2 relative


# -- this round's GPU path (decode.py, optim.py, chunked log-probs): verified on CPU, measured here


def _native_on_cuda():
    from prorl_bench.config import ModelConfig
    from prorl_bench.models.model import TransformerPolicy
    from prorl_bench.models.tokenizers import CharTokenizer

    torch.manual_seed(0)
    tok = CharTokenizer()
    pol = TransformerPolicy(ModelConfig(d_model=64, n_layers=2, n_heads=4, max_seq_len=64), tok.vocab_size)
    with torch.no_grad():
        for p in pol.parameters():
            p.mul_(3.0)
    return pol.cuda().eval(), tok


@pytest.mark.parametrize("bf16", [False, True])
def test_graph_decode_is_captured_and_draws_what_static_draws(bf16):
    """The decode step runs as a CUDA graph (no fallback warning), and two consecutive rollouts draw
    the same tokens as the eager static path with the same generator: graph replays advance the
    generator as eager steps do (whole-buffer attention rounds differently: ties could differ)."""
    import warnings

    from prorl_bench.models.decode import _DECODERS
    from prorl_bench.models.rollout import generate

    pol, tok = _native_on_cuda()
    ids, mask = tok.encode_prompts(["R12=", "R12345=", "S9=", "7"] * 8)
    ids, mask = ids.cuda(), mask.cuda()
    runs = {}
    for impl in ("static", "graph"):
        gen = torch.Generator(device="cuda").manual_seed(5)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("error")  # a failed capture warns and decodes eagerly: fail here instead
            ac = torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16)
            with ac:
                runs[impl] = [generate(pol, tok, ids, mask, 12, 1.0, generator=gen, impl=impl).ids for _ in range(2)]
    assert any(d.cuda_graph is not None for d in _DECODERS[pol].values())
    for a, b in zip(runs["static"], runs["graph"]):
        assert a.shape == b.shape and (a == b).float().mean() > (0.97 if bf16 else 0.999)


def test_fused_adamw_and_host_update_norm_on_cuda():
    from prorl_bench.config import AlgoConfig
    from prorl_bench.rl.optim import ParamSnapshot, build_adamw

    torch.manual_seed(0)
    m = torch.nn.Linear(1024, 1024).cuda()
    opt = build_adamw(list(m.parameters()), AlgoConfig())
    assert opt.defaults["fused"]
    params = list(m.parameters())
    dev, host = ParamSnapshot(params, "device"), ParamSnapshot(params, "auto")
    assert host.mode.value == "host" and all(c.device.type == "cpu" and c.is_pinned() for c in host.copies)
    m(torch.randn(8, 1024, device="cuda")).square().mean().backward()
    opt.step()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    assert host.norm(params) == dev.norm(params) > 0  # the same sums: bit-identical
    extra = torch.cuda.max_memory_allocated() - base
    bound = 2 * 1024 * 1024 * 4 + 2**20  # the design claim: less than this weight and its difference
    assert extra < bound  # whole-tensor form (fp32 copy + fp64 difference + fp64 square): 20 MiB on an H200
    big = [torch.randn(4096, 4096, device="cuda")]  # 64 MiB: the norm's pieces do not grow with the tensor
    snaps = ParamSnapshot(big, "device"), ParamSnapshot(big, "host")
    big[0].add_(1e-3)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    assert snaps[0].norm(big) == snaps[1].norm(big) > 0
    assert torch.cuda.max_memory_allocated() - base < bound


def test_chunked_logprobs_bound_cuda_memory_at_a_150k_vocabulary():
    """A 151,936-token head: the training pass's peak CUDA memory with chunks is a fraction of the
    whole-logits pass's, and the values agree (bf16 autocast, as the trainer runs it)."""
    from prorl_bench.config import ModelConfig
    from prorl_bench.models.model import TransformerPolicy
    from prorl_bench.models.rollout import Rollout, token_logprobs

    torch.manual_seed(0)
    pol = TransformerPolicy(ModelConfig(d_model=256, n_layers=2, n_heads=4, max_seq_len=160), 151_936).cuda()
    b, p, n = 32, 16, 128
    ids = torch.randint(3, 90, (b, p + n), device="cuda")
    batch = Rollout(ids, torch.ones_like(ids, dtype=torch.bool), p, torch.ones(b, n, device="cuda"))

    def peak(mb: float):
        pol.logits_mb = mb
        pol.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logp, ent = token_logprobs(pol, batch, 1.0, (0, 2), with_entropy=True)
        (logp.sum() + ent.sum()).backward()
        torch.cuda.synchronize()
        return logp.detach(), torch.cuda.max_memory_allocated() - base

    whole, whole_peak = peak(1e9)
    parts, parts_peak = peak(256.0)
    logits_bytes = b * n * 151_936 * 4
    assert whole_peak > logits_bytes and parts_peak < whole_peak / 3
    torch.testing.assert_close(parts, whole, rtol=2e-2, atol=2e-2)

"""GPU paths on an HF model: bf16 autocast with every variant, a reset, LoRA growth, resume and
export. Skipped without CUDA (CI and the development VM have none; see the README for whether they
were run on a lent GPU)."""

from __future__ import annotations

import json

import pytest
import torch

from .conftest import make_config, strip_timing

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
    from prorl_bench.trainer import train

    extra = ["reset=periodic", "reset.every=2"] if variant == "C" else []
    cfg = make_config([*GPU, f"model.path={tiny_hf_dir}", f"variant={variant}", "steps=4", *extra])
    summary = train(cfg, tmp_path / "run", tmp_path / "cache")
    assert summary["status"] == "completed" and summary["resets"] == (2 if variant == "C" else 0)
    assert summary["mem/cuda_max_allocated_mb"] > 0


def test_lora_growth_resume_and_export_on_cuda(tiny_hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from prorl_bench.export import export_run, load_run
    from prorl_bench.trainer import train

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
    from prorl_bench.fast_llama import FastLlamaPolicy
    from prorl_bench.hf_model import load_policy

    dev = torch.device("cuda")
    auto = load_policy(ModelConfig(kind=ModelKind.hf_causal_lm, path=str(tiny_hf_dir)), dev)
    hf = load_policy(ModelConfig(kind=ModelKind.hf_causal_lm, path=str(tiny_hf_dir), impl=HFImpl.hf), dev)
    assert isinstance(auto, FastLlamaPolicy)
    ids = torch.randint(3, 90, (4, 12), device=dev)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        mask = torch.ones_like(ids, dtype=torch.bool)
        a, b = auto(ids, mask).float(), hf(ids, mask).float()
    assert (a - b).norm() / b.norm() < 2e-2  # bf16 operands: ~1e-3..1e-2 relative

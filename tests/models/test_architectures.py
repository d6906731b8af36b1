"""Tiny random checkpoints of seven architectures transformers ships (built offline: LLaMA, Qwen2,
Qwen3, Gemma, Phi-3, GPT-NeoX, GPT-2): every one runs variant C with a reset and LoRA with rank
growth on its own module names (GPT-2's Conv1D included), resumes bit-identically, and exports to a
merged directory AutoModelForCausalLM reloads and a PEFT adapter PeftModel reloads, both with the
policy's logits. The fast LLaMA path refuses the other families by name. (All variants A0-C run on
LLaMA in tests/e2e/test_hf_variants.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from prorl_bench.config import ConfigError
from prorl_bench.models.tiny_hf import FAMILIES, build_tiny
from tests.conftest import make_config, strip_timing

pytest.importorskip("transformers")

# each family's attention / MLP linear names as its HF module defines them
TARGETS = {
    "qwen2": "[q_proj,v_proj,down_proj]",
    "gpt_neox": "[query_key_value,dense_4h_to_h]",
    "llama": "[all-linear]",  # PEFT's name: every nn.Linear but the output head
    "gpt2": "[c_attn,c_proj,c_fc]",  # transformers' Conv1D layers (weight stored (in, out))
    "qwen3": "[q_proj,k_proj,o_proj,up_proj]",
    "gemma": "[all-linear]",
    "phi3": "[qkv_proj,gate_up_proj]",  # Phi-3 fuses q/k/v and gate/up itself
}
COMMON = [
    "model=hf_causal_lm", "variant=C", "reset=periodic", "reset.every=2", "adapter=lora", "growth=rank",
    "growth.grow_every=2", "growth.max_rank=8", "algo.prompts_per_step=2", "algo.group_size=4",
    "eval.n_samples=2", "eval.ks=[1,2]", "task.val_size=4", "eval_every=2",
]  # fmt: skip


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("arch")
    return {f: build_tiny(f, root / f) for f in FAMILIES}


def _rows(d):
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("family", list(TARGETS))
def test_family_runs_c_with_reset_and_lora_growth_resumes_and_exports(family, checkpoints, tmp_path):
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from prorl_bench.models.lora import lora_layers
    from prorl_bench.run.export import PEFT_DIR, export_policy, load_run
    from prorl_bench.run.trainer import train

    over = [*COMMON, f"model.path={checkpoints[family]}", f"adapter.targets={TARGETS[family]}"]
    full = train(make_config([*over, "steps=4"]), tmp_path / "full", tmp_path / "cache")
    assert full["status"] == "completed" and full["resets"] == 2
    events = [json.loads(x) for x in (tmp_path / "full" / "events.jsonl").read_text().splitlines()]
    assert [e["new_rank"] for e in events if e["event"] == "growth"] == [6, 8]
    train(make_config([*over, "steps=2"]), tmp_path / "part", tmp_path / "cache")
    train(make_config([*over, "steps=4"]), tmp_path / "part", tmp_path / "cache")  # resumed and extended
    assert strip_timing(_rows(tmp_path / "full")) == strip_timing(_rows(tmp_path / "part"))

    # export the run's final policy (rank 8 after growth); a tiny random policy earns no reward, so
    # its adapters may still be zero: give B trained-looking values first, so that a wrong name or
    # merge (e.g. an untransposed Conv1D delta) changes the logits
    policy, tok, cfg, _ = load_run(tmp_path / "full")
    assert {m.rank for _, m in lora_layers(policy)} == {8}
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for _, layer in lora_layers(policy):
            layer.lora_B.copy_(0.05 * torch.randn(layer.lora_B.shape, generator=g))
    out = export_policy(policy.eval(), cfg, tok, tmp_path / "export")
    ids = torch.tensor([tok.encode("R123=")])
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        ours = policy(ids, mask)
        ours = ours.logits if hasattr(ours, "logits") else ours
        base = AutoModelForCausalLM.from_pretrained(checkpoints[family]).eval()
        before = base(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(out).eval()(input_ids=ids).logits
        theirs = peft.PeftModel.from_pretrained(base, out / PEFT_DIR).eval()(input_ids=ids).logits
    torch.testing.assert_close(merged, ours, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    assert (ours - before).abs().max() > 1e-3  # the adapters change the function


def test_a_target_that_is_not_linear_fails_clearly_naming_it(checkpoints, tmp_path):
    from prorl_bench.run.trainer import train

    cfg = make_config([*COMMON, f"model.path={checkpoints['gpt2']}", "adapter.targets=[wte]", "steps=1"])
    with pytest.raises(ConfigError, match=r"adapter.targets.*wte \(Embedding\).*nn.Linear / Conv1D only"):
        train(cfg, tmp_path / "run", tmp_path / "cache")


@pytest.mark.parametrize("family", ["gemma", "qwen3", "phi3", "gpt_neox", "gpt2"])
def test_fast_path_on_another_family_fails_naming_it(family, checkpoints):
    from prorl_bench.config import HFImpl, ModelConfig, ModelKind
    from prorl_bench.models.hf_model import load_policy

    model = ModelConfig(kind=ModelKind.hf_causal_lm, path=str(checkpoints[family]), impl=HFImpl.fast)
    with pytest.raises(ValueError, match=f"fast LLaMA path cannot run.*model_type '{family}'.*model.impl=hf"):
        load_policy(model, torch.device("cpu"))


def test_gpt2_runs_without_adapters(checkpoints, tmp_path):
    from prorl_bench.run.trainer import train

    over = [o for o in COMMON if not o.startswith(("adapter", "growth"))]
    summary = train(make_config([*over, f"model.path={checkpoints['gpt2']}", "steps=2"]), tmp_path / "r", tmp_path)
    assert summary["status"] == "completed" and summary["resets"] == 1


def test_gpt2_all_linear_wraps_its_conv1d_layers_with_the_base_function(checkpoints):
    """PEFT's all-linear on GPT-2 means its Conv1D layers (not the head); the adapter computes
    x A^T B^T on the Conv1D's (in, out) weight, so shapes follow in/out, not weight.shape."""
    from prorl_bench.config import HFImpl, ModelConfig, ModelKind
    from prorl_bench.models.hf_model import load_policy
    from prorl_bench.models.lora import attach_lora, lora_layers

    model = ModelConfig(kind=ModelKind.hf_causal_lm, path=str(checkpoints["gpt2"]), impl=HFImpl.auto)
    policy = load_policy(model, torch.device("cpu"), ["all-linear"]).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        before = policy(ids, mask)
        n = attach_lora(policy, ["all-linear"], 2, 4.0, True)
        after = policy(ids, mask)
    leaves = sorted({name.rsplit(".", 1)[-1] for name, _ in lora_layers(policy)})
    assert leaves == ["c_attn", "c_fc", "c_proj"] and n == 4 * 2  # 4 per block (c_proj twice), 2 blocks
    assert all(m.lora_A.shape[1] == m.base.weight.shape[0] for _, m in lora_layers(policy))  # fan_in
    torch.testing.assert_close(before, after, rtol=0, atol=0)  # B = 0: attaching changes nothing


def test_all_linear_wraps_every_linear_but_the_head():
    from prorl_bench.models.lora import attach_lora, lora_layers
    from prorl_bench.models.model import TransformerPolicy

    cfg = make_config([])
    policy = TransformerPolicy(cfg.model, 100)
    attach_lora(policy, ["all-linear"], 2, 4.0, True)
    names = sorted({n.rsplit(".", 1)[-1] for n, _ in lora_layers(policy)})
    assert names == ["fc1", "fc2", "proj", "qkv"] and len(lora_layers(policy)) == 4 * cfg.model.n_layers
    assert [n for n, p in policy.named_parameters() if p.requires_grad and "lora_" not in n] == []


@pytest.mark.parametrize(
    "family,targets",
    [("llama", "[q_proj,v_proj,down_proj]"), ("llama", "[qkv,proj,fc1,fc2]"), ("gpt2", "[all-linear]")],
    ids=["hf-names", "fused", "gpt2-conv1d"],
)
def test_peft_adapter_export_reloads_with_equal_logits_after_growth(family, targets, checkpoints, tmp_path):
    """The PEFT directory loads onto the original checkpoint with the policy's logits — also after
    rank growth (PEFT's lora_alpha / r must equal the bench's fixed alpha / r0), for the fast
    path's fused layers (split back into q/k/v and gate/up) and for GPT-2's Conv1D layers
    (PEFT's fan_in_fan_out)."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from prorl_bench.models.hf_model import load_policy, load_tokenizer
    from prorl_bench.models.lora import attach_lora, grow_rank, lora_layers
    from prorl_bench.run.export import PEFT_DIR, export_policy

    cfg = make_config([*COMMON, f"model.path={checkpoints[family]}", f"adapter.targets={targets}"])
    policy = load_policy(cfg.model, torch.device("cpu"), list(cfg.adapter.params.targets))
    attach_lora(policy, list(cfg.adapter.params.targets), 4, 8.0, True)
    grow_rank([policy], 6, seed=1)
    torch.manual_seed(0)
    with torch.no_grad():  # trained-looking adapters: B != 0
        for _, layer in lora_layers(policy):
            layer.lora_B.normal_(0, 0.05)
    tok = load_tokenizer(checkpoints[family])
    out = export_policy(policy.eval(), cfg, tok, tmp_path / "export")
    conf = json.loads((out / PEFT_DIR / "adapter_config.json").read_text())
    assert conf["r"] == 6 and conf["lora_alpha"] == pytest.approx(8.0 / 4 * 6)  # alpha / r0 kept
    assert conf["fan_in_fan_out"] == (family == "gpt2")  # as PEFT itself writes it (else it warns and fixes it)
    ids = torch.tensor([tok.encode("R123=")])
    mask = torch.ones_like(ids, dtype=torch.bool)
    base = AutoModelForCausalLM.from_pretrained(checkpoints[family]).eval()
    with torch.no_grad():
        before = base(input_ids=ids).logits  # PeftModel injects its layers into `base` in place
        theirs = peft.PeftModel.from_pretrained(base, out / PEFT_DIR).eval()(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(out).eval()(input_ids=ids).logits  # the merged export
        ours = policy(ids, mask)
    ours = ours.logits if hasattr(ours, "logits") else ours
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merged, ours, rtol=1e-5, atol=1e-5)
    assert (theirs - before).abs().max() > 1e-3  # the adapters change the function

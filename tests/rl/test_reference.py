"""The LoRA reference without a model copy: frozen base + the reference's own adapter weights.

It must be indistinguishable from a frozen deep copy of the policy (bit-identical trajectories
through resets, polyak mixing, rank growth and resume) while holding adapter-sized tensors only.
"""

from __future__ import annotations

import json

import pytest
import torch

from prorl_bench.config import ModelConfig
from prorl_bench.models.lora import attach_lora, grow_rank
from prorl_bench.models.model import TransformerPolicy
from prorl_bench.rl.reference import AdapterReference, frozen_copy
from prorl_bench.rl.resets import reset_reference
from tests.conftest import strip_timing

LORA = ["adapter=lora", "algo.lr=3e-3"]


def _rows(d):
    return strip_timing([json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()])


def _policy(seed: int = 0) -> TransformerPolicy:
    torch.manual_seed(seed)
    pol = TransformerPolicy(ModelConfig(d_model=16, n_layers=2, n_heads=2), 16)
    attach_lora(pol, ["qkv", "proj", "fc1", "fc2"], rank=2, alpha=4.0, freeze_base=True)
    return pol


def _perturb_adapters(model: torch.nn.Module, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.add_(scale * torch.randn(p.shape, generator=g))


def _logits(model, ids):
    return model(ids, torch.ones_like(ids, dtype=torch.bool))


def test_adapter_reference_equals_a_deep_copy_through_reset_polyak_and_growth():
    pol = _policy()
    ids = torch.randint(0, 16, (3, 10), generator=torch.Generator().manual_seed(1))
    copy_ref, view_ref = frozen_copy(pol), AdapterReference(pol)
    # at the start B = 0: both are exactly the base
    assert torch.equal(_logits(copy_ref, ids), _logits(view_ref, ids))
    _perturb_adapters(pol, 0.3, seed=2)  # the policy moves; the references must not
    assert torch.equal(_logits(copy_ref, ids), _logits(view_ref, ids))
    assert not torch.equal(_logits(pol, ids), _logits(view_ref, ids))
    for alpha in (1.0, 0.6):  # a hard copy, then a polyak mix after the policy moved again
        reset_reference(copy_ref, pol, alpha)
        reset_reference(view_ref, pol, alpha)
        assert torch.equal(_logits(copy_ref, ids), _logits(view_ref, ids))
        _perturb_adapters(pol, 0.3, seed=3)
    grow_rank([pol, copy_ref, view_ref], 5, seed=7)
    assert torch.equal(_logits(copy_ref, ids), _logits(view_ref, ids))
    reset_reference(copy_ref, pol)
    reset_reference(view_ref, pol)
    assert torch.equal(_logits(copy_ref, ids), _logits(view_ref, ids))
    assert torch.equal(_logits(pol, ids), _logits(view_ref, ids))  # just reset: pi_ref == pi_theta
    # the policy's own forward is untouched by the reference (no override left behind)
    assert all(m.override is None for m in pol.modules() if hasattr(m, "override"))


def test_adapter_reference_holds_adapters_only_and_refuses_a_trainable_base():
    pol = _policy()
    ref = AdapterReference(pol)
    n_adapter = sum(p.numel() for n, p in pol.named_parameters() if "lora_" in n)
    assert sum(t.numel() for t in ref.state_dict().values()) == n_adapter
    assert list(ref.parameters()) == []  # nothing for an optimizer to pick up
    torch.manual_seed(0)
    unfrozen = TransformerPolicy(ModelConfig(d_model=16, n_layers=2, n_heads=2), 16)
    attach_lora(unfrozen, ["qkv"], rank=2, alpha=4.0, freeze_base=False)
    with pytest.raises(ValueError, match="frozen base"):
        AdapterReference(unfrozen)


def test_adapter_reference_needs_a_frozen_base_in_config():
    from prorl_bench.config import ConfigError
    from tests.conftest import make_config

    with pytest.raises(ConfigError, match="adapter.reference"):
        make_config(["adapter=lora", "adapter.freeze_base=false", "adapter.reference=adapters"])


@pytest.mark.parametrize(
    "knobs",
    [
        ["variant=A0"],
        ["variant=C", "reset=periodic", "reset.every=2", "growth=rank", "growth.grow_every=3", "growth.max_rank=8"],
        ["variant=C", "reset=polyak", "reset.every=2", "reset.alpha=0.6"],
    ],
    ids=["A0", "C-reset-growth", "C-polyak"],
)
def test_trajectories_equal_the_deep_copy_reference(run_exp, knobs):
    _, d_copy = run_exp([*LORA, *knobs, "adapter.reference=copy"], name="copy")
    _, d_view = run_exp([*LORA, *knobs, "adapter.reference=adapters"], name="adapters")
    rows_copy, rows_view = _rows(d_copy), _rows(d_view)
    assert len(rows_copy) == 6
    assert rows_copy == rows_view  # bit for bit, every metric of every step (timers aside)


def test_adapter_reference_resumes_identically(run_exp, tmp_path):
    knobs = [*LORA, "variant=C", "reset=periodic", "reset.every=2", "adapter.reference=adapters"]
    knobs += ["growth=rank", "growth.grow_every=3", "growth.max_rank=8", "checkpoint.every=3"]
    _, full = run_exp([*knobs], name="full")
    _, part = run_exp([*knobs, "steps=3"], name="resumed")
    _, part = run_exp([*knobs], name="resumed")  # continues from the step-3 checkpoint
    assert _rows(full) == _rows(part)


@pytest.mark.parametrize("impl", ["fast", "hf"])
def test_hf_trajectories_equal_the_deep_copy_reference(impl, tiny_hf_dir, tmp_path):
    pytest.importorskip("transformers")
    from prorl_bench.run.trainer import train
    from tests.conftest import make_config
    from tests.e2e.test_hf_variants import _hf_small

    targets = "[qkv,proj,fc1,fc2]" if impl == "fast" else "[q_proj,v_proj,o_proj,down_proj]"
    knobs = [*_hf_small(tiny_hf_dir), "adapter=lora", f"model.impl={impl}", f"adapter.targets={targets}"]
    knobs += ["variant=C", "reset=periodic", "reset.every=2", "algo.lr=1e-2"]
    runs = {}
    for kind in ("copy", "adapters"):
        train(make_config([*knobs, f"adapter.reference={kind}"]), tmp_path / kind, tmp_path / "cache")
        runs[kind] = _rows(tmp_path / kind)
    assert len(runs["copy"]) == 4 and runs["copy"] == runs["adapters"]

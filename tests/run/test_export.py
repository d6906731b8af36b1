"""Export a run's policy and reload it outside the bench: logits equal the bench policy's."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from prorl_bench.cli.export import main  # noqa: E402
from prorl_bench.config import (  # noqa: E402
    AdapterConfig,
    AdapterKind,
    AlgoConfig,
    CheckpointConfig,
    Config,
    HFImpl,
    ModelConfig,
    ModelKind,
    TaskConfig,
    VariantConfig,
)
from prorl_bench.run.export import export_hf, export_native, load_native, load_run
from prorl_bench.run.trainer import train  # noqa: E402


def _cfg(model: ModelConfig, adapter: AdapterConfig | None = None) -> Config:
    return Config(
        task=TaskConfig(name="reverse_digits", min_len=2, max_len=3, val_size=4),
        variant=VariantConfig.preset("A1"),
        model=model,
        algo=AlgoConfig(prompts_per_step=2, group_size=4, minibatches=1, ppo_epochs=1, lr=1e-2),
        adapter=adapter or AdapterConfig(),
        checkpoint=CheckpointConfig(every=2),
        steps=2,
        eval_every=2,
        progress=False,
    )


def _ids(tok):
    ids, mask = tok.encode_prompts(["12 34", "5"])
    return ids, mask


@pytest.mark.parametrize(
    "impl,targets",
    [
        (HFImpl.fast, None),
        (HFImpl.hf, None),
        (HFImpl.fast, ["qkv", "fc1"]),
        (HFImpl.hf, ["q_proj", "up_proj"]),
        (HFImpl.auto, ["q_proj", "v_proj"]),
    ],
    ids=["fast", "hf", "fast-lora", "hf-lora", "auto-hf-names-lora"],
)
def test_hf_export_reloads_with_equal_logits(impl, targets, tiny_hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = AdapterConfig(kind=AdapterKind.lora, params={"targets": targets, "rank": 2}) if targets else None
    model = ModelConfig(kind=ModelKind.hf_causal_lm, path=str(tiny_hf_dir), impl=impl)
    train(_cfg(model, adapter), tmp_path / "run", tmp_path / "cache", threads=1)
    assert main([str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    policy, tok, cfg, step = load_run(tmp_path / "run")
    assert step == 2
    # A tiny random model earns no reward, so 2 steps may leave it unchanged: perturb every weight
    # (LoRA B included) so that a wrong name mapping or a missing merge changes the logits.
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    export_hf(policy, cfg, tmp_path / "out")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True).eval()
    AutoTokenizer.from_pretrained(tmp_path / "out", local_files_only=True)
    ids, mask = _ids(tok)
    pos = (mask.long().cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        ours = policy(ids, mask)
        theirs = hf(input_ids=ids, attention_mask=mask.long(), position_ids=pos).logits
        base = AutoModelForCausalLM.from_pretrained(tiny_hf_dir, local_files_only=True).eval()
        before = base(input_ids=ids, attention_mask=mask.long(), position_ids=pos).logits
    m = mask.unsqueeze(-1)
    assert torch.allclose(ours * m, theirs * m, atol=1e-5)
    assert not torch.allclose(before * m, theirs * m, atol=1e-4)  # the perturbation is visible


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_native_export_reloads_with_equal_logits(lora, tmp_path):
    adapter = AdapterConfig(kind=AdapterKind.lora, params={"rank": 2}) if lora else None
    cfg = _cfg(ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=32), adapter)
    cfg.warmup.enabled = False
    train(cfg, tmp_path / "run", tmp_path / "cache", threads=1)
    assert main([str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    policy, tok, cfg, _ = load_run(tmp_path / "run")
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in policy.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    export_native(policy, cfg, tok.vocab_size, tmp_path / "out")
    loaded, tok2 = load_native(tmp_path / "out")
    ids, mask = _ids(tok2)
    with torch.no_grad():
        assert torch.allclose(policy(ids, mask), loaded(ids, mask), atol=1e-6)


def test_export_without_checkpoint_fails_loudly(tmp_path, capsys):
    assert main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert "no checkpoints" in capsys.readouterr().err


def test_export_refuses_non_finite_weights(tmp_path, capsys):
    """A checkpoint whose weights hold NaN (a diverged run, checksum intact): a named error, exit 2, and
    nothing written to the output directory."""
    from prorl_bench.run.checkpoint import checkpoint_paths, load_verified, save_verified
    from prorl_bench.run.export import NonFiniteWeightsError, export_run

    cfg = _cfg(ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=32))
    cfg.warmup.enabled = False
    train(cfg, tmp_path / "run", tmp_path / "cache", threads=1)
    path = checkpoint_paths(tmp_path / "run")[-1]
    blob = load_verified(path)
    name = next(k for k, v in blob["policy"].items() if v.is_floating_point() and v.dim() == 2)
    blob["policy"][name][0, 0] = float("nan")
    save_verified(path, blob)  # a valid file: only the values are wrong
    assert main([str(tmp_path / "run"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "NonFiniteWeightsError" in err and name in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(NonFiniteWeightsError, match=name):
        export_run(tmp_path / "run", tmp_path / "out")


def test_sample_cli_from_run_and_export(tmp_path, capsys):
    import json

    from prorl_bench.cli.export import sample_main

    cfg = _cfg(ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=32))
    cfg.warmup.enabled = False
    train(cfg, tmp_path / "run", tmp_path / "cache", threads=1)
    assert main([str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    capsys.readouterr()
    outs = []
    for src in ("run", "out"):
        assert sample_main([str(tmp_path / src), "--prompt", "12", "--n", "3", "--max-new-tokens", "5"]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [r["i"] for r in rows] == [0, 1, 2] and all(len(r["completion"]) <= 5 for r in rows)
        outs.append(rows)
    assert outs[0] == outs[1]  # same weights, same seed: the export samples what the run samples


def test_export_at_end_matches_the_final_policy(tiny_hf_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    model = ModelConfig(kind=ModelKind.hf_causal_lm, path=str(tiny_hf_dir), impl=HFImpl.fast)
    cfg = _cfg(model)
    cfg.export.at_end = True
    summary = train(cfg, tmp_path / "run", tmp_path / "cache", threads=1)
    assert summary["export"] == str(tmp_path / "run" / "export")
    policy, tok, _, _ = load_run(tmp_path / "run")  # checkpoint of the last step = final policy
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "export", local_files_only=True).eval()
    ids, mask = _ids(tok)
    pos = (mask.long().cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask.long(), position_ids=pos).logits
        m = mask.unsqueeze(-1)
        assert torch.allclose(policy(ids, mask) * m, theirs * m, atol=1e-5)


def test_hf_lora_names_under_impl_fast_fail_loudly(tiny_hf_dir, tmp_path):
    from prorl_bench.config import ConfigError

    adapter = AdapterConfig(kind=AdapterKind.lora, params={"targets": ["q_proj", "v_proj"], "rank": 2})
    model = ModelConfig(kind=ModelKind.hf_causal_lm, path=str(tiny_hf_dir), impl=HFImpl.fast)
    with pytest.raises(ConfigError, match=r"adapter.targets.*q_proj.*model.impl=hf"):
        train(_cfg(model, adapter), tmp_path / "run", tmp_path / "cache", threads=1)


def test_exported_tokenizer_and_generate_reproduce_the_bench(tiny_hf_dir, tmp_path, capsys):
    """Plain AutoTokenizer on the export encodes a prompt as the bench does (BOS included, by the
    tokenizer's own add_bos_token), and greedy ``generate`` on the export writes what
    ``prorl-bench-sample --temperature 0`` writes, from the run and from the export."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prorl_bench.cli.export import sample_main

    model = ModelConfig(kind=ModelKind.hf_causal_lm, path=str(tiny_hf_dir), impl=HFImpl.hf)
    train(_cfg(model), tmp_path / "run", tmp_path / "cache", threads=1)
    assert main([str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    _, tok, _, _ = load_run(tmp_path / "run")
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "out", local_files_only=True)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "out", local_files_only=True).eval()
    gc = hf.generation_config  # the bench's sampler never emits PAD/BOS and stops at its EOS: so does generate
    assert gc.suppress_tokens == list(tok.banned_ids) == [tok.BOS] and gc.eos_token_id == tok.EOS == gc.pad_token_id
    prompts = ["12 34", "5", "Q: 7 + 8 = ?"]
    for prompt in prompts:
        ids, mask = tok.encode_prompts([prompt])
        bench_ids = ids[0][mask[0]].tolist()
        assert bench_ids[0] == tok.BOS and hf_tok(prompt)["input_ids"] == bench_ids
    capsys.readouterr()
    for src in ("run", "out"):
        args = [str(tmp_path / src), "--n", "1", "--temperature", "0", "--max-new-tokens", "12"]
        assert sample_main(args + [a for p in prompts for a in ("--prompt", p)]) == 0
        sampled = [json.loads(line)["completion"] for line in capsys.readouterr().out.splitlines()]
        for prompt, text in zip(prompts, sampled):
            enc = hf_tok(prompt, return_tensors="pt")
            with torch.no_grad():
                out = hf.generate(**enc, max_new_tokens=12, do_sample=False)
            generated = hf_tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True).strip()
            assert generated == text, (src, prompt)

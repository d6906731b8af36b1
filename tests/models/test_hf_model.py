"""model=hf_causal_lm: tokenizer adapter, KV-cached sampling, logprobs against HF's own forward."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from hydra import compose, initialize_config_dir  # noqa: E402

from prorl_bench.cli.app import CONF_DIR  # noqa: E402
from prorl_bench.config import ConfigError, HFImpl, ModelConfig, ModelKind, to_config  # noqa: E402
from prorl_bench.models.fast_llama import FastLlamaPolicy  # noqa: E402
from prorl_bench.models.hf_model import HFCausalLMPolicy, load_policy, load_tokenizer  # noqa: E402
from prorl_bench.models.rollout import generate, token_logprobs  # noqa: E402

PROMPTS = ["R123=", "R45678=", "Spell this: ab -4="]


def _load(path, impl: HFImpl = HFImpl.auto):
    return load_policy(ModelConfig(kind=ModelKind.hf_causal_lm, path=str(path), impl=impl), torch.device("cpu"))


def _hf_reference_logprobs(path, rollout, prompt_mask) -> list[torch.Tensor]:
    """Per row: log softmax of the HF model's own forward on the *unpadded* sequence."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True).eval()
    out = []
    with torch.no_grad():
        for r in range(len(rollout)):
            row = rollout.ids[r][rollout.key_mask[r]]
            logp = ref(row[None]).logits[0].float().log_softmax(-1)
            p = rollout.prompt_len - int((~prompt_mask[r]).sum())
            n = int(rollout.completion_mask[r].sum())
            out.append(logp[p - 1 : p - 1 + n].gather(-1, row[p : p + n, None]).squeeze(-1))
    return out


@pytest.mark.parametrize("impl", [HFImpl.hf, HFImpl.fast])
@pytest.mark.parametrize("fixture", ["tiny_hf_dir", "tiny_hf_dir_pad"])
def test_teacher_forced_logprobs_match_hf_forward(impl, fixture, request):
    path = request.getfixturevalue(fixture)
    tok = load_tokenizer(path)
    policy = load_policy(ModelConfig(kind=ModelKind.hf_causal_lm, path=str(path), impl=impl), torch.device("cpu"))
    assert isinstance(policy, HFCausalLMPolicy if impl == HFImpl.hf else FastLlamaPolicy)
    ids, mask = tok.encode_prompts(PROMPTS)
    assert (~mask).any(), "the prompts must be left-padded for this test to mean something"
    rollout = generate(policy, tok, ids, mask, 6, 1.0, generator=torch.Generator().manual_seed(0))
    ours, _ = token_logprobs(policy, rollout, 1.0, ())  # nothing banned: the plain model distribution
    want = _hf_reference_logprobs(path, rollout, mask)
    for r, w in enumerate(want):
        assert len(w) > 0
        torch.testing.assert_close(ours[r, : len(w)], w, atol=1e-5, rtol=1e-5)


def test_fast_and_hf_paths_sample_the_same_tokens(tiny_hf_dir):
    """The KV-cached decode of both implementations agrees token for token (same seed)."""
    tok = load_tokenizer(tiny_hf_dir)
    ids, mask = tok.encode_prompts(PROMPTS)
    outs = []
    for impl in (HFImpl.hf, HFImpl.fast):
        policy = _load(tiny_hf_dir, impl)
        outs.append(generate(policy, tok, ids, mask, 8, 1.0, generator=torch.Generator().manual_seed(3)).ids)
    assert torch.equal(outs[0], outs[1])


def test_tokenizer_without_pad_pads_with_eos_and_keeps_eos_in_mask(tiny_hf_dir):
    tok = load_tokenizer(tiny_hf_dir)
    assert tok.hf.pad_token_id is None and tok.PAD == tok.EOS
    assert tok.EOS not in tok.banned_ids and tok.BOS in tok.banned_ids
    assert tok.decode(tok.encode("ab -4 x=") + [tok.EOS] + tok.encode("zz")) == "ab -4 x="
    ids, mask = tok.encode_prompts(["a", "abc d"])
    assert ids[0, 0] == tok.PAD and not mask[0, 0] and ids[0, -2] == tok.BOS
    # A completion that ends in EOS keeps the EOS token in its mask even though PAD == EOS.
    policy = _load(tiny_hf_dir, HFImpl.fast)  # the fast path exposes lm_head directly
    with torch.no_grad():
        policy.lm_head.weight.zero_()
        policy.lm_head.weight[tok.EOS] = 0.0
        policy.lm_head.weight[tok.EOS, 0] = 1e4  # EOS whenever feature 0 is positive: some rows stop early
    rollout = generate(policy, tok, ids, mask, 5, 1.0, generator=torch.Generator().manual_seed(0))
    comp = rollout.completion_ids
    for r in range(len(rollout)):
        row = comp[r].tolist()
        n = row.index(tok.EOS) + 1 if tok.EOS in row else len(row)
        assert rollout.completion_mask[r].tolist() == [1.0] * n + [0.0] * (len(row) - n)


def test_auto_impl_is_hf_unless_adapters_name_fused_layers(tiny_hf_dir):
    """impl=auto: HF's forward (measured faster on CPU); the fast path only for its fused names."""
    from prorl_bench.models.fast_llama import FastLlamaPolicy

    cfg = ModelConfig(kind=ModelKind.hf_causal_lm, path=str(tiny_hf_dir))
    assert isinstance(load_policy(cfg, torch.device("cpu")), HFCausalLMPolicy)
    assert isinstance(load_policy(cfg, torch.device("cpu"), ["q_proj"]), HFCausalLMPolicy)
    assert isinstance(load_policy(cfg, torch.device("cpu"), ["qkv", "fc1"]), FastLlamaPolicy)


def test_auto_impl_decision_table_per_device():
    """The measured choice: fast on CUDA, HF on CPU; LoRA target names and the family override it."""
    from prorl_bench.models.hf_model import _auto_impl

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert _auto_impl(True, cuda, [], []) == HFImpl.fast
    assert _auto_impl(True, cpu, [], []) == HFImpl.hf
    assert _auto_impl(True, cpu, ["qkv"], []) == HFImpl.fast
    assert _auto_impl(True, cuda, [], ["q_proj"]) == HFImpl.hf  # HF names exist only in HF's forward
    assert _auto_impl(False, cuda, [], []) == HFImpl.hf  # no fast path outside the LLaMA family


def test_auto_impl_falls_back_to_hf_forward_for_other_architectures(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from prorl_bench.models.tiny_hf import char_wordpiece_tokenizer

    tok = char_wordpiece_tokenizer()
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_embd=32,
        n_layer=1,
        n_head=2,
        n_positions=64,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    GPT2LMHeadModel(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    policy = load_policy(ModelConfig(kind=ModelKind.hf_causal_lm, path=str(tmp_path)), torch.device("cpu"))
    assert isinstance(policy, HFCausalLMPolicy)
    with pytest.raises(ValueError, match="fast LLaMA path cannot run"):
        load_policy(ModelConfig(kind=ModelKind.hf_causal_lm, path=str(tmp_path), impl=HFImpl.fast), torch.device("cpu"))
    wrapped = load_tokenizer(tmp_path)
    ids, mask = wrapped.encode_prompts(PROMPTS)
    rollout = generate(policy, wrapped, ids, mask, 4, 1.0, generator=torch.Generator().manual_seed(0))
    ours, _ = token_logprobs(policy, rollout, 1.0, ())
    for r, w in enumerate(_hf_reference_logprobs(tmp_path, rollout, mask)):
        torch.testing.assert_close(ours[r, : len(w)], w, atol=1e-5, rtol=1e-5)


def _compose(overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def test_missing_model_path_is_a_clear_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.path=None.*local Hugging Face model directory"):
        to_config(_compose(["model=hf_causal_lm"]))
    with pytest.raises(ConfigError, match=r"model\.path=.*does not exist"):
        to_config(_compose(["model=hf_causal_lm", f"model.path={tmp_path / 'nope'}"]))
    with pytest.raises(ConfigError, match="has no config.json"):
        to_config(_compose(["model=hf_causal_lm", f"model.path={tmp_path}"]))


def test_flops_per_token_counts_every_linear_weight(tiny_hf_dir):
    for impl in (HFImpl.hf, HFImpl.fast):
        policy = _load(tiny_hf_dir, impl)
        n_linear = sum(p.numel() for n, p in policy.named_parameters() if p.dim() == 2 and "embed" not in n)
        assert policy.flops_per_token(0) == 2.0 * n_linear
        assert policy.flops_per_token(10) > policy.flops_per_token(0)


@pytest.mark.parametrize("impl", [HFImpl.hf, HFImpl.fast])
def test_decoding_raises_no_future_warning(impl, tiny_hf_dir):
    """The KV cache is passed as a Cache object under the name this transformers version takes
    (``cache`` since 5.x: ``past_key_values`` warned on every decoding step of every HF run)."""
    import warnings

    tok = load_tokenizer(tiny_hf_dir)
    policy = _load(tiny_hf_dir, impl)
    ids, mask = tok.encode_prompts(PROMPTS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning, FutureWarning included, fails the test
        generate(policy, tok, ids, mask, 4, 1.0, generator=torch.Generator().manual_seed(0))


def test_tiny_hf_cli_builds_enough_positions_for_chat_tasks(tmp_path):
    import json

    from prorl_bench.models.tiny_hf import CHAT_POSITIONS, main

    def positions(*args):
        out = main([str(tmp_path / "m"), "--hidden", "16", "--layers", "1", *args])
        return json.loads((out / "config.json").read_text())["max_position_embeddings"]

    assert positions() == 256
    assert positions("--chat-template") == CHAT_POSITIONS == 1024
    assert positions("--max-positions", "300") == 300
    from prorl_bench.tasks.base import make_task
    from prorl_bench.tasks.math_jsonl_task import EXAMPLE

    tasks = [["task=code"], ["task=math_jsonl", f"task.path={EXAMPLE}"]]
    try:
        import reasoning_gym  # noqa: F401

        tasks.append(["task=gsm"])
    except ImportError:
        pass
    need = {}  # what the README's chat-task commands need on this model: prompt + completion budget
    for overrides in tasks:
        cfg = to_config(_compose([*overrides, "model=hf_causal_lm", f"model.path={tmp_path / 'm'}"]))
        task = make_task(cfg.task)
        need[overrides[0]] = task.max_prompt_len + task.max_completion_len
    assert max(need.values()) <= CHAT_POSITIONS, need
    assert need["task=code"] > 256  # why the default 256 positions were refused for task=code

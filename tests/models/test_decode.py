"""The decode path without per-token host work (decode.py) against today's sampler (rollout.generate).

``static`` must be the dynamic path bit for bit on CPU: ids, completion masks and the generator
state after the call (the next rollout draws from it). ``graph`` (whole-buffer attention, the form a
CUDA graph captures) computes the same function to rounding.
"""

from __future__ import annotations

import pytest
import torch

from prorl_bench.config import ModelConfig
from prorl_bench.models.decode import sample_exact
from prorl_bench.models.model import TransformerPolicy, positions
from prorl_bench.models.rollout import generate, token_logprobs
from prorl_bench.models.tokenizers import CharTokenizer
from prorl_bench.run.guards import NonFiniteError

TOK = CharTokenizer()
BANNED = tuple(TOK.banned_ids)


def _eos_head(pol: torch.nn.Module, eos_bias: float = 3.0) -> torch.nn.Module:
    """Give the LM head a bias towards EOS, so rows end at different lengths within a few tokens."""
    w = pol.lm_head.weight.detach()
    head = torch.nn.Linear(w.shape[1], w.shape[0], bias=True)
    with torch.no_grad():
        head.weight.copy_(w)
        head.bias.zero_()
        head.bias[TOK.EOS] = eos_bias
    pol.lm_head = head
    return pol.eval()


def _policy(scale: float = 3.0, positions: str = "learned") -> TransformerPolicy:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=64, positions=positions)
    pol = TransformerPolicy(cfg, TOK.vocab_size)
    with torch.no_grad():
        for p in pol.parameters():  # a peaked, not deterministic, random policy
            p.mul_(scale)
    return _eos_head(pol)


def _fast_policy():
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from prorl_bench.models.fast_llama import FastLlamaPolicy

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    hf = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in hf.parameters():
            p.mul_(4.0)
    return _eos_head(FastLlamaPolicy.from_hf(hf))


PROMPTS = ["R12=", "R12345=", "S9=", "R7=", "12 34", "R99999="]  # left-padded to different lengths
CONFIGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=1.0, top_k=20, top_p=0.9),
    dict(temperature=1.0, greedy=True),
]


def _run(pol, impl: str, n: int = 9, seed: int = 1, **kw):
    ids, mask = TOK.encode_prompts(PROMPTS * 2)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        r = generate(pol, TOK, ids, mask, n, kw.pop("temperature"), generator=gen, impl=impl, **kw)
    return r, gen


def _rope_policy():
    return _policy(positions="rope")


def _answer_policy():
    return _policy(positions="answer")


MAKERS = [_policy, _rope_policy, _answer_policy, _fast_policy]
MAKER_IDS = ["native", "native_rope", "native_answer", "fast_llama"]


@pytest.mark.parametrize("make", MAKERS, ids=MAKER_IDS)
@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_static_decode_is_the_dynamic_sampler_bit_for_bit(make, kw):
    pol = make()
    (a, ga), (b, gb) = _run(pol, "dynamic", **dict(kw)), _run(pol, "static", **dict(kw))
    assert torch.equal(a.ids, b.ids) and torch.equal(a.key_mask, b.key_mask)
    assert torch.equal(a.completion_mask, b.completion_mask) and a.prompt_len == b.prompt_len
    assert torch.equal(ga.get_state(), gb.get_state())  # the next rollout draws the same numbers
    with torch.no_grad():
        la, _ = token_logprobs(pol, a, kw["temperature"], BANNED)
        lb, _ = token_logprobs(pol, b, kw["temperature"], BANNED)
    assert torch.equal(la, lb)


def test_rows_end_at_different_lengths_and_early_stop_is_exercised():
    """The configurations above test what they claim: EOS ends some rows early, others run on, and
    the call stops before max_new_tokens once every row has ended."""
    for make in (_policy, _fast_policy):
        r, _ = _run(make(), "static", n=9, temperature=1.0)
        lens = r.completion_mask.sum(-1)
        assert len(set(lens.tolist())) > 2 and bool((r.completion_ids == TOK.EOS).any())
        long, _ = _run(make(), "static", n=40, temperature=1.0)
        assert long.completion_mask.shape[1] < 40  # stopped early: every row emitted EOS


def test_static_early_stop_matches_dynamic_when_every_row_ends():
    pol = _policy()
    (a, ga), (b, gb) = _run(pol, "dynamic", n=40, temperature=1.0), _run(pol, "static", n=40, temperature=1.0)
    assert a.ids.shape == b.ids.shape and torch.equal(a.ids, b.ids)
    assert torch.equal(ga.get_state(), gb.get_state())


@pytest.mark.parametrize("make", MAKERS, ids=MAKER_IDS)
def test_graph_form_decode_step_equals_the_prefix_step_to_rounding(make):
    """The whole-buffer decode step (static shapes) against the filled-prefix step, token by token."""
    pol = make()
    ids, mask = TOK.encode_prompts(PROMPTS)
    b, p = ids.shape
    caches = [pol.new_cache(b, p + 40, ids.device) for _ in range(2)]
    with torch.no_grad():
        for c in caches:
            pol.forward_cached(ids, mask, positions(mask), c)
        pos, tok = mask.long().sum(-1, keepdim=True), ids[:, -1:]
        for t in range(8):
            write = torch.tensor([p + t])
            exact = pol.decode_step(tok, pos, caches[0], write, upto=p + t + 1)
            full = pol.decode_step(tok, pos, caches[1], write)
            torch.testing.assert_close(full, exact, rtol=1e-5, atol=1e-5)
            tok, pos = exact.argmax(-1, keepdim=True), pos + 1


@pytest.mark.parametrize("make", MAKERS, ids=MAKER_IDS)
@pytest.mark.parametrize("kw", CONFIGS[:3], ids=["t1", "topk", "topp"])
def test_graph_form_samples_the_same_tokens_here(make, kw):
    """Rounding-level differences could flip a draw only where two candidates tie to ~1e-7; on these
    configurations the whole-buffer form draws the same tokens and leaves the generator alike."""
    pol = make()
    (a, ga), (b, gb) = _run(pol, "dynamic", **dict(kw)), _run(pol, "graph", **dict(kw))
    assert torch.equal(a.ids, b.ids) and torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(ga.get_state(), gb.get_state())


def test_sample_exact_is_torch_multinomial():
    torch.manual_seed(0)
    for trial in range(50):
        z = torch.randn(int(torch.randint(1, 40, ())), int(torch.randint(2, 200, ()))) * 4
        z[:, :2] = -1e9
        probs = torch.softmax(z, -1)
        g1, g2 = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        want = torch.multinomial(probs, 1, generator=g1).squeeze(-1)
        got, bad = sample_exact(probs, g2)
        assert torch.equal(want, got) and torch.equal(g1.get_state(), g2.get_state()) and not bool(bad)
    assert bool(sample_exact(torch.tensor([[0.5, float("nan")]]), None)[1])
    assert bool(sample_exact(torch.tensor([[0.0, 0.0], [0.5, 0.5]]), None)[1])


@pytest.mark.parametrize("impl", ["dynamic", "static", "graph"])
def test_non_finite_weights_fail_loudly_in_every_impl(impl):
    pol = _policy()
    with torch.no_grad():
        pol.lm_head.weight.fill_(float("nan"))
    with pytest.raises(NonFiniteError, match="non-finite"):
        _run(pol, impl, temperature=1.0)


def test_static_decoders_are_reused_and_follow_replaced_weights():
    """A decoder is kept per shape and settings; a new parameter tensor (LoRA growth) gets a new one,
    and a weight changed in place (an optimizer step) is seen by the kept one."""
    from prorl_bench.models.decode import _DECODERS

    pol = _policy()
    r1, _ = _run(pol, "static", temperature=1.0)
    n = len(_DECODERS[pol])
    _run(pol, "static", temperature=1.0)
    assert len(_DECODERS[pol]) == n
    with torch.no_grad():
        pol.lm_head.weight.mul_(0.0)  # in place: uniform next-token distribution
    r2, _ = _run(pol, "static", temperature=1.0)
    assert len(_DECODERS[pol]) == n and not torch.equal(r1.ids, r2.ids)
    (d, _), (s, _) = _run(pol, "dynamic", temperature=1.0), _run(pol, "static", temperature=1.0)
    assert torch.equal(d.ids, s.ids)
    pol.lm_head.weight = torch.nn.Parameter(pol.lm_head.weight.detach().clone())
    _run(pol, "static", temperature=1.0)
    assert len(_DECODERS[pol]) == n + 1


def test_kept_decoders_do_not_keep_their_policy_alive():
    """The decoders (and their KV caches) die with their policy: a multirun process trains one policy per
    job, and a strong reference back from a kept decoder held every job's policy (~1.3 GB per 300-step
    job; a 16-job multirun was OOM-killed at 21.6 GB)."""
    import gc
    import weakref

    from prorl_bench.models.decode import _DECODERS

    pol = _policy()
    _run(pol, "static", temperature=1.0)
    assert len(_DECODERS[pol]) >= 1
    dead = weakref.ref(pol)
    del pol
    gc.collect()
    assert dead() is None


def test_unknown_impl_and_unsupported_policy_are_refused():
    pol = _policy()
    with pytest.raises(ValueError, match="allowed"):
        _run(pol, "fastest", temperature=1.0)

    class NoStep(torch.nn.Module):
        def new_cache(self, *a):
            raise AssertionError

    with pytest.raises(ValueError, match="decode_step"):
        generate(NoStep(), TOK, *TOK.encode_prompts(["R1="]), 3, 1.0, impl="static")


def test_hardware_decode_resolves_by_policy_and_device():
    """auto: static for the native/fast policies on CPU (bit-identical, measured no slower), graph on
    CUDA, dynamic for HF-module policies; an explicit static/graph on an HF-module policy is refused."""
    from prorl_bench.config import ConfigError
    from prorl_bench.run.policies import decode_impl
    from tests.conftest import make_config

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    native = _policy()
    auto = make_config([])
    assert decode_impl(auto, native, cpu) == "static" and decode_impl(auto, native, cuda) == "graph"

    class HFModule(torch.nn.Module):  # forward_cached but no decode_step, as HFCausalLMPolicy
        def new_cache(self, *a): ...

    assert decode_impl(auto, HFModule(), cuda) == "dynamic"
    assert decode_impl(make_config(["hardware.decode=dynamic"]), native, cuda) == "dynamic"
    with pytest.raises(ConfigError, match="hardware.decode"):
        decode_impl(make_config(["hardware.decode=graph"]), HFModule(), cpu)


def test_graph_key_sees_the_module_state_a_graph_would_bake_in():
    """A captured graph replays Python-level module state as captured: dual-LoRA scales (routing
    evaluation) and train/eval mode must select another decoder, not reuse a stale graph."""
    from prorl_bench.models.decode import _python_state
    from prorl_bench.models.dual_lora import adapter_scales, attach_dual_lora

    pol = _policy()
    attach_dual_lora(pol, ["qkv"], 2, 2, 4.0, True)
    plain = _python_state(pol)
    with adapter_scales(pol, "retain_only"):
        assert _python_state(pol) != plain
    assert _python_state(pol) == plain
    pol.train()
    assert _python_state(pol) != plain


def test_sampling_from_nan_weights_names_the_cause():
    tok = CharTokenizer()
    pol = TransformerPolicy(ModelConfig(d_model=16, n_layers=1, n_heads=2), tok.vocab_size)
    with torch.no_grad():
        pol.lm_head.weight.fill_(float("nan"))
    ids, mask = tok.encode_prompts(["R12="])
    with pytest.raises(NonFiniteError, match="non-finite policy logits while sampling"):
        generate(pol, tok, ids, mask, 4, 1.0, generator=torch.Generator().manual_seed(0))

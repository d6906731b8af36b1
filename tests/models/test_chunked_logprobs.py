"""Log-probs with the LM head run in chunks (rollout.chunked_head): the same values and gradients as
the whole-head computation, and no (B, L, V) logits tensor in the forward or the backward."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from prorl_bench.config import ModelConfig
from prorl_bench.models.model import TransformerPolicy
from prorl_bench.models.rollout import DEFAULT_LOGITS_MB, generate, head_chunk, token_logprobs
from prorl_bench.models.tokenizers import CharTokenizer

TOK = CharTokenizer()
BANNED = tuple(TOK.banned_ids)
VOCAB = 4096  # a vocabulary large enough that the logits dominate every other tensor (ids stay < 192)


def _native(vocab: int = VOCAB) -> TransformerPolicy:
    torch.manual_seed(0)
    return TransformerPolicy(ModelConfig(d_model=32, n_layers=2, n_heads=2, max_seq_len=64), vocab)


def _fast(vocab: int = VOCAB):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    from prorl_bench.models.fast_llama import FastLlamaPolicy

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True)  # fmt: skip
    return FastLlamaPolicy.from_hf(LlamaForCausalLM(cfg))


def _batch(pol):
    ids, mask = TOK.encode_prompts(["R12=", "R12345=", "S9=", "7"] * 4)
    with torch.no_grad():
        return generate(pol, TOK, ids, mask, 12, 1.0, generator=torch.Generator().manual_seed(0), impl="dynamic")


def _budget_for(tokens: int, vocab: int = VOCAB) -> float:
    return tokens * vocab * 4 / 2**20  # logits_mb holding exactly `tokens` tokens' fp32 logits


def _loss_and_grads(pol, batch):
    pol.zero_grad(set_to_none=True)
    logp, ent = token_logprobs(pol, batch, 0.8, BANNED, with_entropy=True)
    w = torch.linspace(-1, 1, logp.numel()).view_as(logp)
    ((logp * w).sum() + 0.1 * ent.sum()).backward()
    return logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in pol.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("make", [_native, _fast], ids=["native", "fast_llama"])
@pytest.mark.parametrize("chunk", [1, 7, 50])
def test_chunked_values_and_gradients_equal_the_whole_head(make, chunk):
    pol = make()
    batch = _batch(pol)
    whole = _loss_and_grads(pol, batch)
    pol.logits_mb = _budget_for(chunk)
    assert head_chunk(pol, batch.completion_mask.numel()) == chunk
    parts = _loss_and_grads(pol, batch)
    torch.testing.assert_close(parts[0], whole[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(parts[1], whole[1], rtol=1e-5, atol=1e-5)
    assert parts[2].keys() == whole[2].keys() and ("lm_head.weight" in parts[2] or "embed.weight" in parts[2])
    for name, g in whole[2].items():  # fp32 sums in another order: equal to ~1e-6 of each gradient's size
        assert float((parts[2][name] - g).norm()) <= 1e-5 * float(g.norm()) + 1e-7, name
    with torch.no_grad():  # the no-grad pass (logp_old, logp_ref) chunks the same way
        nograd, _ = token_logprobs(pol, batch, 0.8, BANNED)
    torch.testing.assert_close(nograd, whole[0], rtol=1e-5, atol=1e-5)


class _MemoryProbe(TorchDispatchMode):
    """Peak bytes of the storages created while it is active (forward and backward ops both run
    through dispatch; a storage counts from the op that creates it until it is freed), and the
    largest tensor any op produced. Storages that existed before (weights, inputs) are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = self.largest = 0
        self.tracked: set[int] = set()

    def _free(self, key: int, nbytes: int) -> None:
        self.tracked.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = [*args, *(kwargs or {}).values()]
        inputs = {a.untyped_storage().data_ptr() for a in flat if isinstance(a, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor):
                continue
            self.largest = max(self.largest, t.numel())
            st = t.untyped_storage()
            if st.data_ptr() in inputs or id(st) in self.tracked:  # in place or a view: nothing new
                continue
            self.tracked.add(id(st))
            self.live += st.nbytes()
            weakref.finalize(st, self._free, id(st), st.nbytes())
        self.peak = max(self.peak, self.live)
        return out


@pytest.mark.parametrize("make", [_native, _fast], ids=["native", "fast_llama"])
def test_peak_memory_is_bounded_by_a_chunk_not_the_whole_logits(make):
    pol = make()
    batch = _batch(pol)
    whole_logits = batch.completion_mask.numel() * VOCAB  # elements of the (B, L, V) logits

    def probe(mb: float) -> _MemoryProbe:
        pol.logits_mb = mb
        pol.zero_grad(set_to_none=True)
        with _MemoryProbe() as mode:
            logp, ent = token_logprobs(pol, batch, 1.0, BANNED, with_entropy=True)
            (logp.sum() + ent.sum()).backward()
            del logp, ent
        return mode

    whole, one = probe(1e6), probe(_budget_for(1))
    assert whole.largest >= whole_logits  # the probe sees the (B, L, V) logits when they exist
    # one token per chunk: the floor every pass shares (parameter gradients, activations); above it the
    # whole head holds several (B, L, V) fp32 tensors at once (logits, tempered logits, probabilities)
    assert whole.peak - one.peak >= 3 * whole_logits * 4
    chunk = 8
    parts = probe(_budget_for(chunk))
    weights = max(p.numel() for p in pol.parameters())  # the (V, D) head/embedding and its gradient
    assert parts.largest <= max(chunk * VOCAB, weights) < whole_logits / 4
    # above the floor a chunked pass holds a few (chunk, V) temporaries, whatever B x L is
    assert parts.peak - one.peak <= 6 * chunk * VOCAB * 4


def test_default_budget_leaves_small_vocabularies_whole_and_adapted_heads_alone():
    """At the character vocabulary nothing is chunked (CPU trajectories unchanged); a wrapped LM head
    (an adapter) is never chunked; neither is a policy without ``hidden``."""
    pol = _native(TOK.vocab_size)
    assert head_chunk(pol, 512 * 64) is None  # 32k tokens x 192 x 4 B = 24 MiB < DEFAULT_LOGITS_MB
    assert 512 * 64 * TOK.vocab_size * 4 < DEFAULT_LOGITS_MB * 2**20
    pol.logits_mb = 1e-3
    assert head_chunk(pol, 64) is not None
    pol.lm_head = torch.nn.Sequential(pol.lm_head)
    assert head_chunk(pol, 64) is None

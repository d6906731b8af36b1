"""Policy: KV-cached decoding agrees with the full forward; left padding does not change outputs."""

import torch

from prorl_bench.config import ModelConfig
from prorl_bench.models.model import TransformerPolicy
from prorl_bench.models.rollout import generate, token_logprobs
from prorl_bench.tasks.base import CharTokenizer


def _policy():
    torch.manual_seed(0)
    return TransformerPolicy(ModelConfig(d_model=32, n_layers=2, n_heads=2), CharTokenizer().vocab_size).eval()


def test_left_padding_is_invisible():
    tok, pol = CharTokenizer(), _policy()
    ids, mask = tok.encode_prompts(["R12=", "R12345="])
    single, smask = tok.encode_prompts(["R12="])
    a = pol(ids, mask)[0, -single.shape[1] :]
    b = pol(single, smask)[0]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_cached_sampling_logprobs_match_teacher_forcing():
    """Greedy decode with the KV cache, then re-score it teacher-forced: every greedy token is the
    argmax of the teacher-forced distribution too, so the cache computes the same function."""
    tok, pol = CharTokenizer(), _policy()
    ids, mask = tok.encode_prompts(["R12=", "R12345=", "S9="])
    batch = generate(pol, tok, ids, mask, 6, 1.0, greedy=True)
    p = batch.prompt_len
    logits = pol(batch.ids, batch.key_mask)[:, p - 1 : -1].clone()
    logits[..., [tok.PAD, tok.BOS]] = -1e9
    m = batch.completion_mask.bool()
    assert torch.equal(logits.argmax(-1)[m], batch.completion_ids[m])
    logp, ent = token_logprobs(pol, batch, 1.0, (tok.PAD, tok.BOS), with_entropy=True)
    assert logp.shape == batch.completion_mask.shape and (logp <= 0).all() and (ent >= 0).all()


def test_sampling_is_deterministic_for_a_seeded_generator():
    tok, pol = CharTokenizer(), _policy()
    ids, mask = tok.encode_prompts(["R12=", "R123="] * 4)
    runs = [generate(pol, tok, ids, mask, 6, 1.0, generator=torch.Generator().manual_seed(3)).ids for _ in range(2)]
    assert torch.equal(runs[0], runs[1])

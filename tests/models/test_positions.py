"""model.positions=rope: rotary position embeddings make attention depend only on token distances.

Checked as mathematics: the rotation preserves norms, q·k after rotation depends only on the position
difference (a shift of every position changes nothing), the KV-cached forward equals the teacher-forced
one, and a left-padded row gives its real tokens the logits of the unpadded row.
"""

from __future__ import annotations

import pytest
import torch

from prorl_bench.config import ConfigError, ModelConfig
from prorl_bench.models.model import TransformerPolicy, apply_rope, positions, rope_tables


def _rot(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, Dh), pos: (B, T)."""
    cos, sin = rope_tables(pos, x.shape[-1])
    return apply_rope(x, cos[:, None], sin[:, None])


def test_rotation_preserves_norms():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 7, 8, generator=g)
    pos = torch.randint(0, 50, (2, 7), generator=g)
    assert torch.allclose(_rot(x, pos).norm(dim=-1), x.norm(dim=-1), atol=1e-5)


def test_scores_depend_only_on_the_position_difference():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 6, 16, generator=g), torch.randn(1, 1, 6, 16, generator=g)
    pos = torch.tensor([[0, 1, 2, 5, 9, 20]])
    scores = _rot(q, pos) @ _rot(k, pos).transpose(-1, -2)
    shifted = _rot(q, pos + 13) @ _rot(k, pos + 13).transpose(-1, -2)
    assert torch.allclose(scores, shifted, atol=1e-4)
    # ... and it is not the identity: unrotated scores differ (the check above could not pass vacuously)
    assert not torch.allclose(scores, q @ k.transpose(-1, -2), atol=1e-2)


def test_pairs_are_rotated_by_their_angle():
    # a closed form for one pair: position p, frequency 1 (i = 0) rotates (1, 0) to (cos p, sin p)
    x = torch.zeros(1, 1, 1, 2)
    x[..., 0] = 1.0
    out = _rot(x, torch.tensor([[3]]))
    assert torch.allclose(out.flatten(), torch.tensor([torch.cos(torch.tensor(3.0)), torch.sin(torch.tensor(3.0))]))


def _policy(positions_kind: str) -> TransformerPolicy:
    torch.manual_seed(0)
    return TransformerPolicy(ModelConfig(positions=positions_kind, d_model=32, n_heads=4, n_layers=2), vocab_size=20)


def test_rope_policy_has_no_position_table():
    assert not hasattr(_policy("rope"), "pos_emb")
    assert hasattr(_policy("learned"), "pos_emb")


@pytest.mark.parametrize("kind", ["learned", "rope"])
def test_cached_forward_equals_teacher_forced(kind):
    policy = _policy(kind).eval()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 20, (3, 9), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :3] = False  # a left-padded row
    mask[1, :1] = False
    full = policy(ids, mask)
    cache = policy.new_cache(3, 9, ids.device)
    pos = positions(mask)
    step_logits = [policy.forward_cached(ids[:, :5], mask[:, :5], pos[:, :5], cache)]
    for t in range(5, 9):
        step_logits.append(policy.forward_cached(ids[:, t : t + 1], mask[:, t : t + 1], pos[:, t : t + 1], cache))
    cached = torch.cat(step_logits, dim=1)
    real = mask
    assert torch.allclose(cached[real], full[real], atol=1e-5)


def test_left_padding_does_not_change_a_rows_logits():
    policy = _policy("rope").eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    padded = torch.tensor([[0, 0, 5, 6, 7, 8]])
    mask = torch.tensor([[False, False, True, True, True, True]])
    a = policy(ids, torch.ones_like(ids, dtype=torch.bool))
    b = policy(padded, mask)[:, 2:]
    assert torch.allclose(a, b, atol=1e-5)


def test_bad_positions_value_names_the_key():
    with pytest.raises(ConfigError, match="model.positions"):
        ModelConfig(positions="alibi")


# -- positions=answer: counted from the answer start


def test_answer_positions_put_every_rows_answer_at_the_anchor():
    policy = _policy("answer")
    anchor = policy.cfg.max_seq_len // 2
    # a batch of prompts of 3 and 5 tokens, left-padded to 5 columns, then 2 completion columns
    mask = torch.tensor([[False, False, True, True, True, True, True], [True] * 7])
    pos = policy._answer_positions(mask, 0, prompt_width=5)
    assert pos[:, 4].tolist() == [anchor - 1, anchor - 1]  # the separator: same position whatever the length
    assert pos[:, 5:].tolist() == [[anchor, anchor + 1]] * 2
    assert pos[0, 2].item() == anchor - 3 and pos[1, 0].item() == anchor - 5  # first real tokens differ
    # the learned scheme counts from each row's first token instead: the answers start at different positions
    assert positions(mask)[:, 5].tolist() == [3, 5]


def test_answer_cached_forward_equals_teacher_forced():
    policy = _policy("answer").eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 20, (2, 9), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, :2] = False
    prompt = 5
    full = policy(ids, mask, keep=9 - prompt + 1)  # what token_logprobs asks for
    cache = policy.new_cache(2, 9, ids.device)
    parts = [policy.forward_cached(ids[:, :prompt], mask[:, :prompt], positions(mask[:, :prompt]), cache)[:, -1:]]
    for t in range(prompt, 9):
        parts.append(policy.forward_cached(ids[:, t : t + 1], mask[:, t : t + 1], torch.zeros(2, 1).long(), cache))
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)


def test_answer_logits_do_not_depend_on_the_batchs_prompt_width():
    policy = _policy("answer").eval()
    row = torch.tensor([[1, 7, 8, 9, 5, 11, 12]])  # prompt of 5 tokens, then 2 completion tokens
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), row], 1)
    mask = torch.ones_like(row, dtype=torch.bool)
    pmask = torch.cat([torch.zeros(1, 3, dtype=torch.bool), mask], 1)
    a = policy(row, mask, keep=3)
    b = policy(padded, pmask, keep=3)
    assert torch.allclose(a, b, atol=1e-5)


def test_answer_positions_need_the_prompt_length():
    policy = _policy("answer")
    ids = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="prompt_len"):
        policy(ids, torch.ones_like(ids, dtype=torch.bool))
    with pytest.raises(ValueError, match="model.max_seq_len"):  # a prompt longer than its half of the table
        policy(torch.ones(1, 40, dtype=torch.long), torch.ones(1, 40, dtype=torch.bool), prompt_len=40)


def test_answer_positions_config_checks_both_halves():
    from tests.conftest import make_config

    make_config(["model.positions=answer"])  # the default task fits
    with pytest.raises(ConfigError, match="model.max_seq_len"):
        make_config(["model.positions=answer", "model.max_seq_len=16"])

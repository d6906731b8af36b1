"""model.positions=rope: rotary position embeddings make attention depend only on token distances.

Checked as mathematics: the rotation preserves norms, q·k after rotation depends only on the position
difference (a shift of every position changes nothing), the KV-cached forward equals the teacher-forced
one, and a left-padded row gives its real tokens the logits of the unpadded row.
"""

from __future__ import annotations

import pytest
import torch

from prorl_bench.config import ConfigError, ModelConfig
from prorl_bench.model import TransformerPolicy, apply_rope, positions, rope_tables


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

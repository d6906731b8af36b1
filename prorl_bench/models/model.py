"""A small decoder-only transformer policy with a preallocated KV cache.

Sequences are left-padded prompts followed by the completion. Padding is handled with a key mask
and position ids from the mask's cumulative sum, so a left-padded prompt sees the same positions
as an unpadded one. Dropout is off by default (the A0 = A1 = A2 invariant needs determinism).

Positions (``model.positions``):

* ``learned``: a learned embedding of the position counted from the row's first token (GPT-2).
* ``answer``: the same learned table, but positions are counted from the **answer start**: the last prompt
  column is ``max_seq_len // 2 - 1`` in every row and the completion starts at ``max_seq_len // 2``.
* ``rope``: rotary embeddings of the position counted from the row's first token (RoPE, Su et al. 2021,
  "RoFormer"): attention scores depend only on the distance between tokens.

Why it matters (DESIGN.md section 11): reversing an n-digit input means output token k copies the input
token mirrored around the separator and stops when the mirror reaches the prompt's start. Counted from
the row's start (``learned``), that mirror sits at a different position for each n, so 3-, 4- and 5-digit
inputs compete for the same position embeddings and RL drives one length to zero. Counted from the answer
start (``answer``), the mirror of position p is the same position for every n, and so is the stop rule.
Under ``rope`` the copy is one relative rule, but a mirror is not (it depends on where the separator is),
and the stop decision needs counting: measured, RL zeroed the 4-digit inputs there too (docs/regime.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from prorl_bench.config import ModelConfig
from prorl_bench.models.lora import matmul_params


def positions(key_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0 at each row's first real token, padding clamped to 0.
    key_mask: (B, T) bool -> (B, T) long. One formula for every forward and the sampler."""
    return (key_mask.long().cumsum(-1) - 1).clamp_min(0)


def rope_tables(pos: torch.Tensor, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of RoPE's rotation angles pos * base^(-2i/head_dim), i < head_dim/2, repeated for both halves.
    pos: (B, T) long -> two (B, T, head_dim) fp32 tensors; computed once per forward."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim)
    angles = pos.to(torch.float32)[..., None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x[..., i], x[..., i + Dh/2]) of x (..., Dh) by the angles in cos/sin (broadcastable to x)
    — the half-split layout of GPT-NeoX/LLaMA (one cat instead of strided pairs). A rotation preserves norms, and
    q.k after rotating both depends only on the difference of their positions."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


@dataclass
class KVCache:
    """Per-layer key/value buffers of shape (B, H, T_max, Dh); ``length`` positions are filled."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_mask: torch.Tensor  # (B, T_max) bool: which cached positions are real tokens
    length: int = 0
    prompt_width: int | None = None  # columns of the first (prompt) call: the answer starts after them
    # positions=answer: anchor - prompt_width on the device, so a captured decode step reads it (decode_step)
    answer_shift: torch.Tensor = field(default_factory=lambda: torch.zeros(1, dtype=torch.long))

    @classmethod
    def allocate(
        cls,
        n_layers: int,
        batch: int,
        heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> KVCache:
        """Zeroed buffers; under CUDA autocast they take the autocast dtype (what attention sees)."""
        if device.type == "cuda" and torch.is_autocast_enabled("cuda"):
            dtype = torch.get_autocast_dtype("cuda")
        shape = (batch, heads, max_len, head_dim)
        return cls(
            keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)],
            values=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)],
            key_mask=torch.zeros(batch, max_len, dtype=torch.bool, device=device),
            answer_shift=torch.zeros(1, dtype=torch.long, device=device),
        )

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, write: torch.Tensor | None, upto: int | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, H, t, Dh) and return the keys/values attention reads.

        ``write`` None: the dynamic path, at ``length`` (a host int), reading the filled prefix.
        ``write`` a (1,) long device tensor: the static decode step (t = 1) writes there with no host
        value involved (CUDA-graph safe) and reads the whole buffer (``upto`` None, static shapes; the
        key mask hides unwritten positions) or its first ``upto`` positions (the exact CPU form).
        """
        keys, values = self.keys[layer], self.values[layer]
        if write is None:
            start = self.length
            keys[:, :, start : start + k.shape[2]] = k
            values[:, :, start : start + k.shape[2]] = v
            end = start + k.shape[2]
        else:
            keys.index_copy_(2, write, k.to(keys.dtype))
            values.index_copy_(2, write, v.to(values.dtype))
            end = keys.shape[2] if upto is None else upto
        return keys[:, :, :end], values[:, :, :end]

    def static_mask(self, write: torch.Tensor, upto: int | None) -> torch.Tensor:
        """Mark position ``write`` as a real token; the (B, 1, 1, T) attention mask of a decode step."""
        self.key_mask.index_fill_(1, write, True)
        km = self.key_mask if upto is None else self.key_mask[:, :upto]
        return km[:, None, None, :]


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.dropout = cfg.dropout

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor,
        cache: KVCache | None = None,
        layer: int = 0,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        write: torch.Tensor | None = None,
        upto: int | None = None,
    ) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, h, d // h)
        if rope is not None:  # q and k rotated in one go; keys are cached rotated (each keeps its own angle)
            cos, sin = (z[:, :, None, None, :] for z in rope)  # (B, T, 1, 1, Dh) against (B, T, 2, H, Dh)
            qkv = torch.cat((apply_rope(qkv[:, :, :2], cos, sin), qkv[:, :, 2:]), dim=2)
        q, k, v = (z.transpose(1, 2) for z in qkv.unbind(2))
        if cache is not None:
            k, v = cache.append(layer, k, v, write, upto)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
        y = y.transpose(1, 2).reshape(b, t, d)
        x = x + F.dropout(self.proj(y), p, self.training)
        x = x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), p, self.training)
        return x


class TransformerPolicy(nn.Module):
    """GPT-style policy. ``forward`` returns logits (B, T, vocab)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.rope = cfg.positions == "rope"
        self.answer_anchor = cfg.max_seq_len // 2 if cfg.positions == "answer" else None
        if not self.rope:  # no unused parameter under RoPE (it would sit in AdamW and in the checkpoint)
            self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    # -- forward passes
    def forward(
        self, ids: torch.Tensor, key_mask: torch.Tensor, keep: int = 0, prompt_len: int | None = None
    ) -> torch.Tensor:
        """Full (teacher-forced) forward. ids, key_mask: (B, T). Returns logits (B, T, V), or only
        the last ``keep`` positions' (B, keep, V) when keep > 0 (the LM head skips the prompt).
        ``prompt_len``: the prompt's columns (left-padded prompts end there); ``positions=answer`` needs it,
        and takes ``T - keep + 1`` when keep > 0 (the scored completion plus the last prompt column)."""
        return self.lm_head(self.hidden(ids, key_mask, keep, prompt_len))

    def hidden(
        self, ids: torch.Tensor, key_mask: torch.Tensor, keep: int = 0, prompt_len: int | None = None
    ) -> torch.Tensor:
        """The LM head's input (B, T or keep, D): ``forward`` is ``lm_head(hidden(...))``, so the
        log-probs can run the head a chunk of positions at a time (rollout.token_logprobs)."""
        t = ids.shape[1]
        if self.answer_anchor is None:
            pos = positions(key_mask)
        else:
            if prompt_len is None and keep <= 0:
                raise ValueError(
                    "model.positions=answer: forward() needs prompt_len (or keep) to find the answer start"
                )
            pos = self._answer_positions(key_mask, 0, t - keep + 1 if prompt_len is None else prompt_len)
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        # Every query may attend to itself, so left-pad rows never see an all-masked row (NaN).
        eye = torch.eye(t, dtype=torch.bool, device=ids.device)
        attn = (causal & key_mask[:, None, :]) | eye
        x, rope = self._embed(ids, pos)
        for blk in self.blocks:
            x = blk(x, attn[:, None], rope=rope)
        if keep > 0:
            x = x[:, -keep:]
        return self.ln_f(x)

    def _answer_positions(self, key_mask: torch.Tensor, first_col: int, prompt_width: int) -> torch.Tensor:
        """Positions counted from the answer start: column c -> anchor + c - prompt_width (the same in every
        row: prompts are left-padded to prompt_width columns). key_mask: (B, t) for columns first_col.."""
        anchor, limit = self.answer_anchor, self.cfg.max_seq_len
        t = key_mask.shape[1]
        cols = torch.arange(first_col, first_col + t, device=key_mask.device)
        if prompt_width > anchor or first_col + t - prompt_width > limit - anchor:
            raise ValueError(
                f"model.positions=answer: a prompt of {prompt_width} tokens or a completion of "
                f"{first_col + t - prompt_width} does not fit model.max_seq_len={limit} (prompts get "
                f"{anchor} positions, completions {limit - anchor}): raise model.max_seq_len"
            )
        pos = (cols - prompt_width + anchor).clamp_min(0)  # left padding below 0 is masked: any position will do
        return pos.expand(key_mask.shape[0], t)

    def _embed(self, ids: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, tuple | None]:
        """Token embeddings plus learned positions, or token embeddings and RoPE's (cos, sin) tables."""
        if self.rope:
            return self.tok_emb(ids), rope_tables(pos, self.cfg.d_model // self.cfg.n_heads)
        return self.tok_emb(ids) + self.pos_emb(pos), None

    def new_cache(self, batch: int, max_len: int, device: torch.device) -> KVCache:
        h = self.cfg.n_heads
        dh = self.cfg.d_model // h
        return KVCache.allocate(len(self.blocks), batch, h, max_len, dh, self.tok_emb.weight.dtype, device)

    def forward_cached(
        self, ids: torch.Tensor, key_mask: torch.Tensor, pos: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Incremental forward: append ids (B, t) at cache.length. Returns logits (B, t, V). ``pos`` (B, t) is
        used as given, except under ``positions=answer``: the first call is the prompt, and positions are
        counted from the end of its columns."""
        b, t = ids.shape
        start = cache.length
        if self.answer_anchor is not None:
            if start == 0:
                cache.prompt_width = t
                cache.answer_shift.fill_(self.answer_anchor - t)  # read on the device by decode_step
            pos = self._answer_positions(key_mask, start, cache.prompt_width)
        cache.key_mask[:, start : start + t] = key_mask
        total = start + t
        causal = torch.ones(t, total, dtype=torch.bool, device=ids.device).tril(diagonal=start)
        self_pos = torch.zeros(t, total, dtype=torch.bool, device=ids.device)
        self_pos[torch.arange(t), start + torch.arange(t)] = True
        attn = (causal & cache.key_mask[:, None, :total]) | self_pos
        x, rope = self._embed(ids, pos)
        for i, blk in enumerate(self.blocks):
            x = blk(x, attn[:, None], cache=cache, layer=i, rope=rope)
        cache.length = total
        return self.lm_head(self.ln_f(x))

    def decode_step(
        self, ids: torch.Tensor, pos: torch.Tensor, cache: KVCache, write: torch.Tensor, upto: int | None = None
    ) -> torch.Tensor:
        """One token per row with static shapes: ids, pos (B, 1) at cache index ``write`` ((1,) long,
        on the device). Returns logits (B, V). No host value is read (CUDA-graph capturable) when
        ``upto`` is None; ``upto`` = write + 1 reads only the filled prefix, which is exactly
        ``forward_cached``'s computation (decode.py, the exact CPU form)."""
        attn = cache.static_mask(write, upto)
        if self.answer_anchor is not None:  # the column is the cache index: no host value read
            pos = (write + cache.answer_shift).expand_as(pos)
        x, rope = self._embed(ids, pos)
        for i, blk in enumerate(self.blocks):
            x = blk(x, attn, cache=cache, layer=i, rope=rope, write=write, upto=upto)
        return self.lm_head(self.ln_f(x))[:, -1]

    # -- accounting
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token (linear weights and LoRA A/B; not embeddings)."""
        return matmul_params(self)

    def flops_per_token(self, context: int) -> float:
        """Forward FLOPs per token: 2 per matmul weight plus attention scores/values at ``context``."""
        attn = 4 * self.cfg.n_layers * context * self.cfg.d_model
        return 2.0 * self.matmul_params() + attn


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

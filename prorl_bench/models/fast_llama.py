"""A lean forward for LLaMA-family Hugging Face checkpoints (llama, mistral, qwen2).

Same weights and same math as ``transformers``' modules (RMSNorm, rotary embeddings taken from the
HF model's own ``rotary_emb``, grouped-query attention, SwiGLU MLP, optional q/k/v biases), but
without the per-call overhead of the general-purpose module (mask builders, cache objects, output
dataclasses), with q/k/v and gate/up fused into one matmul each, and with a preallocated KV cache
like the native policy's. ``tests/models/test_hf_model.py`` checks its logprobs against the HF forward.

Layer names follow the native policy (``qkv``, ``proj``, ``fc1`` = fused gate|up, ``fc2`` = down), so
``adapter=lora`` with its default targets wraps the same projections on both (LoRA on ``fc1`` is one
adapter over the fused gate|up matmul). With ``model.impl=hf`` use HF names (q_proj, ..., down_proj).

Shapes: B batch, T tokens, D hidden, H query heads, Hkv key/value heads, Dh head dim, V vocab.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from prorl_bench.models.lora import matmul_params
from prorl_bench.models.model import KVCache, positions

SUPPORTED = {"llama", "mistral", "qwen2"}
STATIC_ROPE = {"default", "linear", "llama3"}  # inv_freq fixed at load time


def unsupported_reason(config) -> str | None:
    """Why ``config`` cannot use the fast path (None if it can)."""
    if getattr(config, "model_type", "") not in SUPPORTED:
        return f"model_type {getattr(config, 'model_type', None)!r} not in {sorted(SUPPORTED)}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} != 'silu'"
    if getattr(config, "mlp_bias", False):
        return "mlp_bias=True"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in STATIC_ROPE:
        return f"rope_type {rope_type!r} is not static"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        if config.sliding_window < getattr(config, "max_position_embeddings", 0):
            return "sliding-window attention"
    return None


class _Layer(nn.Module):
    def __init__(self, d: int, h: int, hkv: int, dh: int, inter: int, eps: float, qkv_bias: bool, o_bias: bool):
        super().__init__()
        self.h, self.hkv, self.dh, self.eps = h, hkv, dh, eps
        self.in_norm = nn.Parameter(torch.ones(d))
        self.qkv = nn.Linear(d, (h + 2 * hkv) * dh, bias=qkv_bias)
        self.proj = nn.Linear(h * dh, d, bias=o_bias)
        self.post_norm = nn.Parameter(torch.ones(d))
        self.fc1 = nn.Linear(d, 2 * inter, bias=False)
        self.fc2 = nn.Linear(inter, d, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: torch.Tensor,
        cache: KVCache | None,
        layer: int,
        write: torch.Tensor | None = None,
        upto: int | None = None,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        h, hkv, dh = self.h, self.hkv, self.dh
        q, k, v = self.qkv(F.rms_norm(x, (x.shape[-1],), self.in_norm, self.eps)).split(
            [h * dh, hkv * dh, hkv * dh], dim=-1
        )
        q = q.view(b, t, h, dh).transpose(1, 2)
        k = k.view(b, t, hkv, dh).transpose(1, 2)
        v = v.view(b, t, hkv, dh).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if cache is not None:
            k, v = cache.append(layer, k, v, write, upto)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn, enable_gqa=hkv != h)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, h * dh))
        gate, up = self.fc1(F.rms_norm(x, (x.shape[-1],), self.post_norm, self.eps)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(gate) * up)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's rotate-half rotary embedding; x (B, H, T, Dh), cos/sin (B, 1, T, Dh)."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


class FastLlamaPolicy(nn.Module):
    """LLaMA-family causal LM with the native policy's interface. Build with :meth:`from_hf`."""

    def __init__(self, config) -> None:
        super().__init__()
        c = config
        self.config = c
        d, h = c.hidden_size, c.num_attention_heads
        hkv = getattr(c, "num_key_value_heads", None) or h
        dh = getattr(c, "head_dim", None) or d // h
        self.n_layers, self.h, self.hkv, self.dh = c.num_hidden_layers, h, hkv, dh
        self.eps = float(c.rms_norm_eps)
        self.max_positions = int(c.max_position_embeddings)
        qkv_bias = bool(getattr(c, "attention_bias", False)) or c.model_type == "qwen2"
        o_bias = bool(getattr(c, "attention_bias", False)) and c.model_type != "qwen2"
        self.embed = nn.Embedding(c.vocab_size, d)
        self.layers = nn.ModuleList(
            _Layer(d, h, hkv, dh, c.intermediate_size, self.eps, qkv_bias, o_bias) for _ in range(c.num_hidden_layers)
        )
        self.norm = nn.Parameter(torch.ones(d))
        self.lm_head = nn.Linear(d, c.vocab_size, bias=False)
        if getattr(c, "tie_word_embeddings", False):
            self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", torch.zeros(dh // 2), persistent=False)
        self.attention_scaling = 1.0

    @classmethod
    def from_hf(cls, model: nn.Module) -> FastLlamaPolicy:
        """Copy the weights of a transformers LLaMA-family ``*ForCausalLM`` (raises ValueError if unsupported)."""
        reason = unsupported_reason(model.config)
        if reason:
            raise ValueError(f"fast LLaMA path cannot run this checkpoint: {reason}; use model.impl=hf")
        self = cls(model.config)
        base = model.model
        with torch.no_grad():
            self.embed.weight.copy_(base.embed_tokens.weight)
            for mine, theirs in zip(self.layers, base.layers):
                a, m = theirs.self_attn, theirs.mlp
                mine.in_norm.copy_(theirs.input_layernorm.weight)
                mine.post_norm.copy_(theirs.post_attention_layernorm.weight)
                mine.qkv.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
                if mine.qkv.bias is not None:
                    mine.qkv.bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
                mine.proj.weight.copy_(a.o_proj.weight)
                if mine.proj.bias is not None:
                    mine.proj.bias.copy_(a.o_proj.bias)
                mine.fc1.weight.copy_(torch.cat([m.gate_proj.weight, m.up_proj.weight]))
                mine.fc2.weight.copy_(m.down_proj.weight)
            self.norm.copy_(base.norm.weight)
            if not getattr(model.config, "tie_word_embeddings", False):
                self.lm_head.weight.copy_(model.lm_head.weight)
            self.inv_freq.copy_(base.rotary_emb.inv_freq.float())
        self.attention_scaling = float(getattr(base.rotary_emb, "attention_scaling", 1.0))
        return self

    # -- forward passes
    def _cos_sin(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = pos[..., None].float() * self.inv_freq  # (B, T, Dh/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, Dh)
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)

    def _run(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        attn: torch.Tensor,
        cache: KVCache | None,
        keep: int = 0,
        write: torch.Tensor | None = None,
        upto: int | None = None,
    ) -> torch.Tensor:
        """The final-normed hidden states (B, T or keep, D), the LM head's input."""
        x = self.embed(ids)
        cos, sin = self._cos_sin(pos, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attn, cache, i, write, upto)
        if keep > 0:
            x = x[:, -keep:]
        return F.rms_norm(x, (x.shape[-1],), self.norm, self.eps)

    def forward(self, ids: torch.Tensor, key_mask: torch.Tensor, keep: int = 0) -> torch.Tensor:
        """Teacher-forced logits (B, T, V), or the last ``keep`` positions' (B, keep, V) if keep > 0;
        left padding is skipped by positions and the key mask."""
        return self.lm_head(self.hidden(ids, key_mask, keep))

    def hidden(self, ids: torch.Tensor, key_mask: torch.Tensor, keep: int = 0) -> torch.Tensor:
        """The LM head's input (B, T or keep, D): ``forward`` is ``lm_head(hidden(...))``."""
        t = ids.shape[1]
        pos = positions(key_mask)
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        eye = torch.eye(t, dtype=torch.bool, device=ids.device)  # pad rows attend to themselves: no NaN
        attn = ((causal & key_mask[:, None, :]) | eye)[:, None]
        return self._run(ids, pos, attn, None, keep)

    def new_cache(self, batch: int, max_len: int, device: torch.device) -> KVCache:
        return KVCache.allocate(len(self.layers), batch, self.hkv, max_len, self.dh, self.embed.weight.dtype, device)

    def forward_cached(
        self, ids: torch.Tensor, key_mask: torch.Tensor, pos: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Append ids (B, t) at ``cache.length`` (positions ``pos`` (B, t)); logits (B, t, V)."""
        t, start = ids.shape[1], cache.length
        cache.key_mask[:, start : start + t] = key_mask
        total = start + t
        causal = torch.ones(t, total, dtype=torch.bool, device=ids.device).tril(diagonal=start)
        self_pos = torch.zeros(t, total, dtype=torch.bool, device=ids.device)
        self_pos[torch.arange(t), start + torch.arange(t)] = True
        attn = ((causal & cache.key_mask[:, None, :total]) | self_pos)[:, None]
        logits = self.lm_head(self._run(ids, pos, attn, cache))
        cache.length = total
        return logits

    def decode_step(
        self, ids: torch.Tensor, pos: torch.Tensor, cache: KVCache, write: torch.Tensor, upto: int | None = None
    ) -> torch.Tensor:
        """One token per row with static shapes (see ``TransformerPolicy.decode_step``); logits (B, V)."""
        attn = cache.static_mask(write, upto)
        return self.lm_head(self._run(ids, pos, attn, cache, write=write, upto=upto))[:, -1]

    # -- accounting
    def matmul_params(self) -> int:
        return matmul_params(self)

    def flops_per_token(self, context: int) -> float:
        """Forward FLOPs per token: 2 per matmul weight + attention scores/values at ``context``."""
        return 2.0 * self.matmul_params() + 4.0 * self.n_layers * context * self.h * self.dh

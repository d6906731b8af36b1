"""A population of native transformer policies as one batched module (a leading member dimension).

``StackedPolicy`` holds every parameter of S ``TransformerPolicy`` members stacked along a new
leading dimension (S, ...). Linear layers are batched matmuls over the stacked weights
(``torch.baddbmm``), embeddings gather from the flattened (S * V, d) tables, layer norms normalise
and then apply each member's own affine. Attention runs on (S * B) rows at once.

The stack is a copy of the members' weights, taken when it is built (``StackedPolicy(members)``,
once per batched call): the members stay ordinary ``TransformerPolicy`` modules that their own
optimizer, resets and checkpoints act on. A population uses it where batching pays on a CPU —
KV-cached sampling, one token of S * B rows at a time (population/sampling.py); the teacher-forced
``forward`` (with gradients) is kept for the design benchmark (benchmarks/bench_population.py),
which measured it slower than S member forwards in a loop on this machine.

Rounding: the batched matmul sums each dot product over the same inputs as ``F.linear``; whether
the last bits agree depends on the BLAS kernel chosen for the shapes (measured in
tests/population/test_population.py: equal at equal widths). Layer norm applies the affine after
normalising (two roundings where ``F.layer_norm`` fuses them); padding rows to a common width adds
exactly-zero attention terms in a different summation order. Both differ from a single run in the last bits only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prorl_bench.models.model import TransformerPolicy, positions


@dataclass
class StackedKVCache:
    """Per-layer key/value buffers of shape (S * B, H, T_max, Dh), member-major rows."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_mask: torch.Tensor  # (S * B, T_max) bool
    length: int = 0


class StackedPolicy(torch.nn.Module):
    """S same-shaped native policies as one module with a leading member dimension.

    ``forward(ids, key_mask, keep)``: ids, key_mask (S, B, T) -> logits (S, B, T or keep, V).
    ``forward_cached`` is the KV-cached incremental forward of the sampler, on (S, B, t) inputs.
    """

    def __init__(self, members: list[TransformerPolicy]) -> None:
        super().__init__()
        if not members:
            raise ValueError("a population needs at least one member")
        first = members[0]
        for i, m in enumerate(members):
            if not stackable(m):
                raise TypeError(f"member {i} is a {type(m).__name__}: populations batch native TransformerPolicy only")
            if m.cfg != first.cfg or m.vocab_size != first.vocab_size:
                raise ValueError(f"member {i} has another model shape than member 0: {m.cfg} != {first.cfg}")
        self.cfg = first.cfg
        self.vocab_size = first.vocab_size
        self.size = len(members)
        self._flops_per_token = first.flops_per_token
        self.names = [n for n, _ in first.named_parameters()]
        self.stack = torch.nn.ParameterDict()
        for name in self.names:
            per = [m.get_parameter(name) for m in members]
            stacked = torch.stack([p.detach() for p in per])  # a copy: the members keep their own tensors
            self.stack[name.replace(".", "/")] = torch.nn.Parameter(stacked, requires_grad=per[0].requires_grad)

    def w(self, name: str) -> torch.Tensor:
        """The stacked parameter (S, ...) of the member parameter called ``name``."""
        return self.stack[name.replace(".", "/")]

    # -- building blocks (x: (S, N, d_in))
    def _linear(self, x: torch.Tensor, name: str, bias: bool = True) -> torch.Tensor:
        s = x.shape[0]
        flat = x.reshape(s, -1, x.shape[-1])
        wt = self.w(f"{name}.weight").transpose(1, 2)
        if bias:
            y = torch.baddbmm(self.w(f"{name}.bias")[:, None, :], flat, wt)
        else:
            y = torch.bmm(flat, wt)
        return y.view(*x.shape[:-1], y.shape[-1])

    def _layer_norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        d = x.shape[-1]
        w = self.w(f"{name}.weight")
        b = self.w(f"{name}.bias")
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (d,)
        return torch.addcmul(b.view(shape), F.layer_norm(x, (d,)), w.view(shape))

    def _embed(self, ids: torch.Tensor, name: str) -> torch.Tensor:
        table = self.w(name)  # (S, V, d)
        s, v, d = table.shape
        offset = (torch.arange(s, device=ids.device) * v).view(s, *([1] * (ids.dim() - 1)))
        return F.embedding(ids + offset, table.reshape(s * v, d))

    def _block(self, i: int, x: torch.Tensor, attn: torch.Tensor, cache: StackedKVCache | None) -> torch.Tensor:
        s, b, t, d = x.shape
        h = self.cfg.n_heads
        pre = f"blocks.{i}"
        q, k, v = self._linear(self._layer_norm(x, f"{pre}.ln1"), f"{pre}.qkv").split(d, dim=-1)
        q, k, v = (z.reshape(s * b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            start = cache.length
            cache.keys[i][:, :, start : start + t] = k
            cache.values[i][:, :, start : start + t] = v
            k = cache.keys[i][:, :, : start + t]
            v = cache.values[i][:, :, : start + t]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn)
        y = y.transpose(1, 2).reshape(s, b, t, d)
        x = x + self._linear(y, f"{pre}.proj")
        hdn = F.gelu(self._linear(self._layer_norm(x, f"{pre}.ln2"), f"{pre}.fc1"))
        return x + self._linear(hdn, f"{pre}.fc2")

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear(self._layer_norm(x, "ln_f"), "lm_head", bias=False)

    # -- forward passes
    def forward(self, ids: torch.Tensor, key_mask: torch.Tensor, keep: int = 0) -> torch.Tensor:
        """Teacher-forced forward. ids, key_mask: (S, B, T) -> logits (S, B, T, V), or the last
        ``keep`` positions' (S, B, keep, V) when keep > 0 (as ``TransformerPolicy.forward``)."""
        s, b, t = ids.shape
        pos = positions(key_mask)
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        eye = torch.eye(t, dtype=torch.bool, device=ids.device)
        attn = ((causal & key_mask.reshape(s * b, 1, t)) | eye)[:, None]
        x = self._embed(ids, "tok_emb.weight") + self._embed(pos, "pos_emb.weight")
        for i in range(self.cfg.n_layers):
            x = self._block(i, x, attn, None)
        if keep > 0:
            x = x[:, :, -keep:]
        return self._head(x)

    def new_cache(self, batch: int, max_len: int, device: torch.device) -> StackedKVCache:
        """Zeroed cache buffers for ``batch`` rows per member (autocast dtype on CUDA, as KVCache)."""
        h = self.cfg.n_heads
        dh = self.cfg.d_model // h
        dtype = self.w("tok_emb.weight").dtype
        if device.type == "cuda" and torch.is_autocast_enabled("cuda"):
            dtype = torch.get_autocast_dtype("cuda")
        shape = (self.size * batch, h, max_len, dh)
        return StackedKVCache(
            keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.cfg.n_layers)],
            values=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(self.cfg.n_layers)],
            key_mask=torch.zeros(self.size * batch, max_len, dtype=torch.bool, device=device),
        )

    def forward_cached(
        self, ids: torch.Tensor, key_mask: torch.Tensor, pos: torch.Tensor, cache: StackedKVCache
    ) -> torch.Tensor:
        """Incremental forward: append ids (S, B, t) at cache.length. Returns logits (S, B, t, V)."""
        s, b, t = ids.shape
        start = cache.length
        cache.key_mask[:, start : start + t] = key_mask.reshape(s * b, t)
        total = start + t
        causal = torch.ones(t, total, dtype=torch.bool, device=ids.device).tril(diagonal=start)
        self_pos = torch.zeros(t, total, dtype=torch.bool, device=ids.device)
        self_pos[torch.arange(t), start + torch.arange(t)] = True
        attn = ((causal & cache.key_mask[:, None, :total]) | self_pos)[:, None]
        x = self._embed(ids, "tok_emb.weight") + self._embed(pos, "pos_emb.weight")
        for i in range(self.cfg.n_layers):
            x = self._block(i, x, attn, cache)
        cache.length = total
        return self._head(x)

    # -- accounting (per member, as TransformerPolicy)
    def flops_per_token(self, context: int) -> float:
        return self._flops_per_token(context)


def stackable(policy: torch.nn.Module) -> bool:
    """True for a plain native policy (no adapters, no hooks) with learned positions counted from the
    row start: what ``StackedPolicy`` reproduces (``answer``/``rope`` positions sample alone)."""
    return (
        type(policy) is TransformerPolicy
        and policy.cfg.positions == "learned"
        and all(
            type(m) in (TransformerPolicy, torch.nn.ModuleList, torch.nn.Embedding, torch.nn.Linear, torch.nn.LayerNorm)
            or type(m).__name__ == "Block"
            for m in policy.modules()
        )
    )

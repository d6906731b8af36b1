"""Sampling with a KV cache, and teacher-forced log-probabilities of sampled tokens.

Both paths see the same distribution: logits / temperature with the PAD and BOS tokens removed
(``policy_logits``). ``logp_old``, ``logp_ref`` and ``logp_theta`` are therefore log-probabilities
of the *sampling* distribution, as in verl. top-k and top-p (nucleus) only filter which token is
drawn: the logprobs of the loss, the ratio and the KL stay those of the full tempered distribution,
as in TRL (its loss recomputes logits / temperature without the warpers) and verl.
"""

from __future__ import annotations

import torch

from prorl_bench.models.decode import generate_static, supports_static
from prorl_bench.models.model import positions
from prorl_bench.models.sampling import _NEG, Rollout, draw, filter_logits, nucleus, policy_logits  # noqa: F401 - re-exported
from prorl_bench.models.tokenizers import CharTokenizer

DECODE_IMPLS = ("dynamic", "static", "graph")  # generate(impl=...): see generate and decode.py


def _banned(tok: CharTokenizer) -> tuple[int, ...]:
    return tuple(tok.banned_ids)


def generate(
    policy: torch.nn.Module,
    tok: CharTokenizer,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    top_k: int = 0,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    top_p: float = 1.0,
    impl: str | None = None,
) -> Rollout:
    """Sample completions with a KV cache; stop early once every row has emitted EOS.

    ``tok`` is any tokenizer with PAD/EOS ids and ``banned_ids`` (CharTokenizer, HFTokenizer). The
    completion mask is tracked from the done flags, not from ``!= PAD``, so a tokenizer whose PAD is
    its EOS (HF models without a pad token) keeps the EOS token in the mask.

    ``impl`` (default: the policy's ``decode_impl`` attribute, set from ``hardware.decode`` by
    ``policies.load_base_policy``, else ``dynamic``): ``dynamic`` is this function's loop; ``static``
    and ``graph`` run ``decode.generate_static`` (no per-token host sync; ``graph`` with static shapes,
    a CUDA graph on CUDA). ``static`` gives bit-identical results; see decode.py for ``graph``.
    """
    b, p = prompt_ids.shape
    device = prompt_ids.device
    # On GPU, checking `done.all()` is a host sync: do it every few tokens only.
    check_every = 1 if device.type == "cpu" else 8
    impl = impl or getattr(policy, "decode_impl", "dynamic")
    if impl not in DECODE_IMPLS:
        raise ValueError(f"decode impl {impl!r}: allowed {DECODE_IMPLS}")
    if impl != "dynamic":
        if not supports_static(policy):
            raise ValueError(f"decode impl {impl!r} needs a policy with decode_step ({type(policy).__name__} has none)")
        return generate_static(
            policy, tok, prompt_ids, prompt_mask, max_new_tokens, temperature, top_k, generator, greedy, top_p,
            full=impl == "graph", check_every=check_every,
        )  # fmt: skip
    cache = policy.new_cache(b, p + max_new_tokens, device)
    pos = positions(prompt_mask)
    logits = policy.forward_cached(prompt_ids, prompt_mask, pos, cache)[:, -1]
    next_pos = prompt_mask.long().sum(-1, keepdim=True)
    out = torch.full((b, max_new_tokens), tok.PAD, dtype=torch.long, device=device)
    live = torch.zeros((b, max_new_tokens), dtype=torch.bool, device=device)  # token t is generated
    done = torch.zeros(b, dtype=torch.bool, device=device)
    ones = torch.ones(b, 1, dtype=torch.bool, device=device)
    banned = _banned(tok)
    for t in range(max_new_tokens):
        z = policy_logits(logits, temperature, banned)
        nxt = z.argmax(-1) if greedy else draw(filter_logits(z, top_k, top_p), logits, generator, t)
        nxt = torch.where(done, torch.full_like(nxt, tok.PAD), nxt)
        out[:, t] = nxt
        live[:, t] = ~done
        done |= nxt == tok.EOS
        if t == max_new_tokens - 1 or ((t + 1) % check_every == 0 and bool(done.all())):
            out, live = out[:, : t + 1], live[:, : t + 1]
            break
        logits = policy.forward_cached(nxt[:, None], ones, next_pos, cache)[:, -1]
        next_pos = next_pos + 1
    completion_mask = live.float()
    ids = torch.cat([prompt_ids, out], dim=1)
    key_mask = torch.cat([prompt_mask, torch.ones_like(out, dtype=torch.bool)], dim=1)
    return Rollout(ids=ids, key_mask=key_mask, prompt_len=p, completion_mask=completion_mask)


def token_logprobs(
    model: torch.nn.Module,
    batch: Rollout,
    temperature: float,
    banned: tuple[int, ...],
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Teacher-forced log pi(token) of each completion token: (B, L); entropy (B, L) if asked.

    The logprob is gathered as logit[y] - logsumexp(logits) so no (B, L, V) log-softmax is built.
    When the (B, L, V) fp32 logits would exceed the model's ``logits_mb`` (``hardware.logits_mb``,
    default 256 MiB), the LM head runs on chunks of tokens instead (``chunked_head``), so a 150k-token
    vocabulary never holds more than one chunk's logits, in the forward or the backward.
    """
    # Only the L completion tokens are scored: the LM head runs on the last L + 1 positions only.
    n = batch.ids.shape[1] - batch.prompt_len
    chunk = head_chunk(model, len(batch) * n)
    if chunk is not None:
        hidden = model.hidden(batch.ids, batch.key_mask, keep=n + 1)[:, :-1]
        return chunked_head(model.lm_head, hidden, batch.completion_ids, temperature, banned, with_entropy, chunk)
    logits = model(batch.ids, batch.key_mask, keep=n + 1)[:, :-1]
    return _head_logprobs(logits, batch.completion_ids, temperature, banned, with_entropy)


DEFAULT_LOGITS_MB = 256.0  # hardware.logits_mb's default, for models built outside a run


def head_chunk(model: torch.nn.Module, tokens: int) -> int | None:
    """Tokens per LM-head chunk, or None to run it whole: when the fp32 logits of ``tokens`` tokens
    fit in ``logits_mb`` MiB, or the model cannot split its head off (HF-module policies; an adapted
    LM head, whose adapter may depend on a context that a backward-time recompute would not see)."""
    head = getattr(model, "lm_head", None)
    if type(head) is not torch.nn.Linear or not callable(getattr(model, "hidden", None)):
        return None
    budget = getattr(model, "logits_mb", DEFAULT_LOGITS_MB) * 2**20
    per_token = head.out_features * 4  # fp32 bytes of one token's logits
    if tokens * per_token <= budget:
        return None
    return max(1, int(budget // per_token))


def _head_logprobs(
    logits: torch.Tensor, ids: torch.Tensor, temperature: float, banned: tuple[int, ...], with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(ids) (and the entropy) from logits (..., V) of the tokens ids (...)."""
    z = policy_logits(logits, temperature, banned)
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - lse
    entropy = None
    if with_entropy:
        probs = torch.softmax(z, dim=-1)
        entropy = lse - (probs * z).sum(-1)
    return logp, entropy


def chunked_head(
    head: torch.nn.Module,
    hidden: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
    banned: tuple[int, ...],
    with_entropy: bool,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``_head_logprobs(head(hidden), ids, ...)`` ``chunk`` tokens at a time. hidden (B, L, D), ids (B, L).

    Under autograd each chunk runs in ``torch.utils.checkpoint``: its logits are freed after the
    forward and recomputed, one chunk at a time, in the backward (one extra LM-head matmul per chunk,
    the price of never holding the (B, L, V) logits). Values equal the unchunked ones to rounding
    (the LM head's matmul runs on fewer rows; tests/models/test_chunked_logprobs.py).
    """
    from torch.utils.checkpoint import checkpoint

    b, n, d = hidden.shape
    flat_h, flat_y = hidden.reshape(b * n, d), ids.reshape(b * n)

    def one(h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return _head_logprobs(head(h), y, temperature, banned, with_entropy)

    logps, ents = [], []
    for s in range(0, b * n, chunk):
        h, y = flat_h[s : s + chunk], flat_y[s : s + chunk]
        if torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in head.parameters())):
            lp, ent = checkpoint(one, h, y, use_reentrant=False)
        else:
            lp, ent = one(h, y)
        logps.append(lp)
        ents.append(ent)
    logp = torch.cat(logps).view(b, n)
    return logp, (torch.cat(ents).view(b, n) if with_entropy else None)


@torch.no_grad()
def chunked_logprobs(
    model: torch.nn.Module,
    batch: Rollout,
    temperature: float,
    banned: tuple[int, ...],
    chunk: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """No-grad logprobs (B, L) computed ``chunk`` rows at a time (the minibatch size).

    Chunking by the minibatch size makes every no-grad pass run on the same tensor shapes as the
    update's forward, so the numbers agree bit for bit. ``out`` (optional) receives the result.
    """
    n = len(batch)
    if out is None:
        out = torch.empty(batch.completion_mask.shape, dtype=torch.float32, device=batch.ids.device)
    for s in range(0, n, chunk):
        idx = torch.arange(s, min(s + chunk, n), device=batch.ids.device)
        out[s : s + len(idx)] = token_logprobs(model, batch.rows(idx), temperature, banned)[0]
    return out

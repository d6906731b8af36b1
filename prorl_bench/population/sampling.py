"""Member-batched KV-cached sampling: S members' ``rollout.generate`` calls as one computation.

Each member's request is exactly the arguments its own run passes to ``rollout.generate``; the
result is the ``Rollout`` that call would return, drawn with the member's own generator:

* the S prompt batches are left-padded to one width (positions come from the key mask, so a row's
  positions do not change) and run as (S, B, t) through ``StackedPolicy.forward_cached``;
* the filters (temperature, banned ids, top-k, top-p) are the single sampler's functions on the
  stacked logits; the draw is one ``torch.multinomial`` per member on its own (B, V) slice with its
  own generator, so each generator advances exactly as in the single run;
* member i stops drawing where its single run stops (every row done, checked every ``check_every``
  tokens as ``generate`` does; or the token budget) and its completion is cut there; the others go
  on. A stopped member's generator is not touched again.

The logits equal the single run's bit for bit when the prompt widths agree, and to the last bits
otherwise (extra masked keys change a reduction's grouping): a token drawn differently needs a
uniform draw within ~1e-7 of a CDF boundary (tests/population/test_population.py measures it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from prorl_bench.models.model import positions
from prorl_bench.models.sampling import Rollout, draw, filter_logits, policy_logits
from prorl_bench.population.model import StackedPolicy, stackable


@dataclass
class SampleRequest:
    """One member's ``rollout.generate`` call (the same arguments, by name)."""

    policy: torch.nn.Module
    tok: object
    prompt_ids: torch.Tensor  # (B, P_i) left-padded
    prompt_mask: torch.Tensor  # (B, P_i) bool
    max_new_tokens: int
    temperature: float
    top_k: int = 0
    generator: torch.Generator | None = None
    greedy: bool = False
    top_p: float = 1.0
    call: dict[str, Any] = field(default_factory=dict)  # every argument of the original call, by name

    def __post_init__(self) -> None:
        if not self.call:
            self.call = {
                "policy": self.policy, "tok": self.tok, "prompt_ids": self.prompt_ids, "prompt_mask": self.prompt_mask,
                "max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_k": self.top_k,
                "generator": self.generator, "greedy": self.greedy, "top_p": self.top_p,
            }  # fmt: skip

    def batchable(self) -> bool:
        """A plain native policy with the default decode loop (or ``static``, bit-identical to it);
        anything else (adapters, HF models, a graph decoder) samples alone with its original call."""
        impl = self.call.get("impl") or getattr(self.policy, "decode_impl", None) or "dynamic"
        return stackable(self.policy) and impl in ("dynamic", "static")

    def signature(self) -> tuple:
        """Requests with equal signatures can be sampled as one batch."""
        t = self.tok
        return (
            self.prompt_ids.shape[0], self.max_new_tokens, self.temperature, self.top_k, self.greedy, self.top_p,
            self.prompt_ids.device, t.PAD, t.EOS, tuple(t.banned_ids), repr(self.policy.cfg), self.policy.vocab_size,
        )  # fmt: skip


def _left_pad(ids: torch.Tensor, mask: torch.Tensor, width: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    extra = width - ids.shape[1]
    if extra == 0:
        return ids, mask
    return (
        torch.cat([ids.new_full((ids.shape[0], extra), pad), ids], dim=1),
        torch.cat([mask.new_zeros((mask.shape[0], extra)), mask], dim=1),
    )


@torch.no_grad()
def generate_population(requests: list[SampleRequest]) -> list[Rollout]:
    """The Rollout each request's own ``generate`` call returns, sampled as one (S, B) batch.

    Every request must have the same ``signature()`` (ValueError otherwise).
    """
    first = requests[0]
    if any(r.signature() != first.signature() for r in requests):
        raise ValueError("generate_population: requests differ in batch size, budget, sampling knobs or model")
    s, b, n_new = len(requests), first.prompt_ids.shape[0], first.max_new_tokens
    tok, device = first.tok, first.prompt_ids.device
    width = max(r.prompt_ids.shape[1] for r in requests)
    padded = [_left_pad(r.prompt_ids, r.prompt_mask, width, tok.PAD) for r in requests]
    prompt_ids = torch.stack([p[0] for p in padded])  # (S, B, P)
    prompt_mask = torch.stack([p[1] for p in padded])
    model = StackedPolicy([r.policy for r in requests])
    cache = model.new_cache(b, width + n_new, device)
    logits = model.forward_cached(prompt_ids, prompt_mask, positions(prompt_mask), cache)[:, :, -1]
    next_pos = prompt_mask.long().sum(-1, keepdim=True)
    out = torch.full((s, b, n_new), tok.PAD, dtype=torch.long, device=device)
    live = torch.zeros((s, b, n_new), dtype=torch.bool, device=device)
    done = torch.zeros(s, b, dtype=torch.bool, device=device)
    ones = torch.ones(s, b, 1, dtype=torch.bool, device=device)
    check_every = 1 if device.type == "cpu" else 8  # as rollout.generate
    stopped = [None] * s  # the width at which member i's own generate stopped
    banned = tuple(tok.banned_ids)
    for t in range(n_new):
        z = policy_logits(logits, first.temperature, banned)  # (S, B, V)
        if not first.greedy:
            z = filter_logits(z, first.top_k, first.top_p)
        nxt = torch.full((s, b), tok.PAD, dtype=torch.long, device=device)
        for i, r in enumerate(requests):
            if stopped[i] is None:
                nxt[i] = z[i].argmax(-1) if first.greedy else draw(z[i], logits[i], r.generator, t)
        nxt = torch.where(done, torch.full_like(nxt, tok.PAD), nxt)
        out[:, :, t] = nxt
        live[:, :, t] = ~done
        done |= nxt == tok.EOS
        for i in range(s):
            if stopped[i] is None and (t == n_new - 1 or ((t + 1) % check_every == 0 and bool(done[i].all()))):
                stopped[i] = t + 1
        if all(w is not None for w in stopped):
            break
        logits = model.forward_cached(nxt[:, :, None], ones, next_pos, cache)[:, :, -1]
        next_pos = next_pos + 1
    rollouts = []
    for i, r in enumerate(requests):
        o = out[i, :, : stopped[i]]
        rollouts.append(
            Rollout(
                ids=torch.cat([r.prompt_ids, o], dim=1),
                key_mask=torch.cat([r.prompt_mask, torch.ones_like(o, dtype=torch.bool)], dim=1),
                prompt_len=r.prompt_ids.shape[1],
                completion_mask=live[i, :, : stopped[i]].float(),
            )
        )
    return rollouts

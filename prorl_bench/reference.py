"""Where reference log-probabilities come from: one small strategy object per variant.

The trainer calls ``prepare(batch)`` once per rollout (stage ``ref_logprob``) and
``logp(idx, minibatch)`` inside every PPO epoch / minibatch. What each variant does there is the
whole point of the A0/A1/A2/B axis:

* A0  RecomputeReference  nothing at rollout; a reference forward in *every* minibatch.
* A1  CachedReference     one forward per rollout, cached; minibatches slice the cache.
* A2  BufferedReference   as A1 into a buffer allocated once and reused every step.
* B   NoReference         no reference model exists; the KL term is taken against pi_old.
* C   CachedReference     as A1; resets rewrite the reference weights between steps.
"""

from __future__ import annotations

import copy

import torch

from prorl_bench.accounting import StepAccounting
from prorl_bench.config import VariantName
from prorl_bench.rollout import Rollout, chunked_logprobs, token_logprobs


def frozen_copy(policy: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(policy)
    ref.requires_grad_(False)
    return ref.eval()


class Reference:
    """Interface. ``model`` is None when the variant has no reference model."""

    model: torch.nn.Module | None = None

    def __init__(self, temperature: float, banned: tuple[int, ...], chunk: int, flops_per_token) -> None:
        self.temperature = temperature
        self.banned = banned
        self.chunk = chunk
        self._flops_per_token = flops_per_token

    def _forward_cost(self, acct: StepAccounting, batch: Rollout) -> None:
        tokens = batch.key_mask.sum()  # a device scalar: StepAccounting reads it once per step
        acct.forward("ref", tokens, tokens * self._flops_per_token(batch.ids.shape[1]))

    def prepare(self, batch: Rollout, acct: StepAccounting) -> None:
        """Called once per rollout, before the update."""

    def logp(self, idx: torch.Tensor, mb: Rollout, acct: StepAccounting) -> torch.Tensor | None:
        """Reference logprobs (len(idx), L) of the minibatch rows ``idx``; None if no reference."""
        raise NotImplementedError


class NoReference(Reference):
    """Variant B: no reference model is built; there is nothing to compute."""

    def logp(self, idx: torch.Tensor, mb: Rollout, acct: StepAccounting) -> None:
        return None


class CachedReference(Reference):
    """Variants A1 and C: one reference pass per rollout, reused by every epoch and minibatch."""

    def __init__(self, model: torch.nn.Module, **kw) -> None:
        super().__init__(**kw)
        self.model = model
        self._cache: torch.Tensor | None = None

    def prepare(self, batch: Rollout, acct: StepAccounting) -> None:
        self._cache = chunked_logprobs(self.model, batch, self.temperature, self.banned, self.chunk)
        self._forward_cost(acct, batch)

    def logp(self, idx: torch.Tensor, mb: Rollout, acct: StepAccounting) -> torch.Tensor:
        return self._cache[idx]


class BufferedReference(CachedReference):
    """Variant A2: as A1, but written into one preallocated (max_batch, max_len) buffer.

    ``allocations`` counts buffer allocations; it stays 1 for the whole run (tested).
    """

    def __init__(self, model: torch.nn.Module, max_batch: int, max_len: int, device: torch.device, **kw) -> None:
        super().__init__(model, **kw)
        self.buffer = torch.empty(max_batch, max_len, dtype=torch.float32, device=device)
        self.allocations = 1

    def prepare(self, batch: Rollout, acct: StepAccounting) -> None:
        b, length = batch.completion_mask.shape
        if b > self.buffer.shape[0] or length > self.buffer.shape[1]:
            raise ValueError(
                f"A2 reference buffer {tuple(self.buffer.shape)} is smaller than the batch ({b}, {length})"
            )
        view = self.buffer[:b, :length]
        chunked_logprobs(self.model, batch, self.temperature, self.banned, self.chunk, out=view)
        self._cache = view
        self._forward_cost(acct, batch)


class RecomputeReference(Reference):
    """Variant A0: the deliberately wasteful baseline — a reference forward in every minibatch."""

    def __init__(self, model: torch.nn.Module, **kw) -> None:
        super().__init__(**kw)
        self.model = model

    @torch.no_grad()
    def logp(self, idx: torch.Tensor, mb: Rollout, acct: StepAccounting) -> torch.Tensor:
        self._forward_cost(acct, mb)
        return token_logprobs(self.model, mb, self.temperature, self.banned)[0]


def build_reference(
    variant: VariantName,
    policy: torch.nn.Module,
    *,
    temperature: float,
    banned: tuple[int, ...],
    chunk: int,
    max_batch: int,
    max_len: int,
    device: torch.device,
) -> Reference:
    """The variant's reference strategy; for B no model copy is made at all."""
    kw = dict(temperature=temperature, banned=banned, chunk=chunk, flops_per_token=policy.flops_per_token)
    if variant == VariantName.B:
        return NoReference(**kw)
    model = frozen_copy(policy)
    if variant == VariantName.A0:
        return RecomputeReference(model, **kw)
    if variant == VariantName.A2:
        return BufferedReference(model, max_batch, max_len, device, **kw)
    if variant in (VariantName.A1, VariantName.C):
        return CachedReference(model, **kw)
    raise ValueError(f"variant.name={variant!r}: allowed {[v.value for v in VariantName]}")

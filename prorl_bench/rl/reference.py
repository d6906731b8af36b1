"""Where reference log-probabilities come from: one small strategy object per variant.

The trainer calls ``prepare(batch)`` once per rollout (stage ``ref_logprob``) and
``logp(idx, minibatch)`` inside every PPO epoch / minibatch. What each variant does there is the
whole point of the A0/A1/A2/B axis:

* A0  RecomputeReference  nothing at rollout; a reference forward in *every* minibatch.
* A1  CachedReference     one forward per rollout, cached; minibatches slice the cache.
* A2  BufferedReference   as A1 into a buffer allocated once and reused every step.
* B   NoReference         no reference model exists; the KL term is taken against pi_old.
* C   CachedReference     as A1; resets rewrite the reference weights between steps.

Every strategy is built from the same ``ReferenceContext`` (the policy, the shapes of a step, the
device, the way the reference model is held) and its own parameters (``params=``: flat keys of the
``variant`` section, bound once by ``REFERENCES.build``), so a new strategy is one class in one file.
A strategy states whether its reference moves on its own (``moves``; hook: ``before_rollout``,
called before every rollout), and ``is_base`` says whether the reference model
still equals the initial base — the trainer's ``kl/base`` reads it (a reset also moves it).

Where the reference *model* comes from is a second, independent choice: a frozen deep copy of the
policy, or — for a LoRA policy whose base is frozen — ``AdapterReference``: the policy's own frozen
base with a separate copy of the adapter weights (zero B at the start, so exactly the base; the
policy's adapters after a reset; an alpha-mix for polyak). It holds adapter-sized tensors only.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from prorl_bench.models.lora import LoRALinear, growth_generator, lora_layers
from prorl_bench.models.rollout import Rollout, chunked_logprobs, token_logprobs
from prorl_bench.registry import REFERENCES
from prorl_bench.rl.resets import reset_reference


def frozen_copy(policy: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(policy)
    ref.requires_grad_(False)
    return ref.eval()


class StepAccounting(Protocol):
    """What a reference strategy needs of the run's accounting (prorl_bench/run/accounting.py's
    StepAccounting is one): count a forward pass's tokens and FLOPs under a stage name."""

    def forward(self, who: str, tokens: int | torch.Tensor, flops: float | torch.Tensor) -> None: ...


class AdapterReference(torch.nn.Module):
    """pi_ref = the policy's frozen base + the reference's own adapter weights; no model copy.

    Valid only when every non-adapter parameter of the policy is frozen: the base is then shared
    by policy and reference, and they differ by the adapters alone (TRL gets pi_ref by disabling a
    PEFT adapter; this also covers the reference after a reset, whose adapters are not zero).
    A forward runs the *policy* module with each LoRA layer's ``override`` set to the reference's
    (A, B) — the same operations on the same values as a deep copy, so logprobs agree bit for bit.
    Its ``state_dict`` holds the adapter tensors only (what a checkpoint must keep).
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        trainable = [n for n, p in policy.named_parameters() if p.requires_grad and "lora_" not in n]
        if trainable:
            raise ValueError(
                f"an adapter reference needs a frozen base, but {trainable[:3]} are trainable "
                "(adapter.freeze_base=false): use adapter.reference=copy"
            )
        layers = lora_layers(policy)
        if not layers:
            raise ValueError("an adapter reference needs LoRA layers on the policy (adapter=lora)")
        object.__setattr__(self, "_policy", policy)  # not a submodule: the base weights are not ours
        self._names = [name for name, _ in layers]
        for i, (_, layer) in enumerate(layers):
            self.register_buffer(f"A{i}", layer.lora_A.detach().clone())
            self.register_buffer(f"B{i}", layer.lora_B.detach().clone())
        self.flops_per_token = policy.flops_per_token

    def _pairs(self) -> list[tuple[LoRALinear, torch.Tensor, torch.Tensor]]:
        layers = dict(lora_layers(self._policy))
        return [(layers[n], getattr(self, f"A{i}"), getattr(self, f"B{i}")) for i, n in enumerate(self._names)]

    @contextmanager
    def _active(self) -> Iterator[None]:
        pol = self._policy
        was_training = pol.training
        pairs = self._pairs()
        pol.eval()  # as a frozen copy is
        for layer, a, b in pairs:
            layer.override = (a, b)
        try:
            yield
        finally:
            for layer, _, _ in pairs:
                layer.override = None
            pol.train(was_training)

    def forward(self, *args, **kwargs):
        with self._active():
            return self._policy(*args, **kwargs)

    @torch.no_grad()
    def reset_from(
        self, policy: torch.nn.Module, alpha: float = 1.0, weights: dict[str, torch.Tensor] | None = None
    ) -> None:
        """pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref on the adapters (the base is shared);
        ``weights`` (name -> tensor of the policy's trainable parameters: ``reset.source=best``) stand in
        for the policy's adapters."""
        if policy is not self._policy:
            raise ValueError("an adapter reference can only be reset from the policy it belongs to")
        for name, (layer, a, b) in zip(self._names, self._pairs()):
            src = (layer.lora_A, layer.lora_B)
            if weights is not None:
                src = (weights[f"{name}.lora_A"], weights[f"{name}.lora_B"])
            for ref_t, pol_t in zip((a, b), src):
                if ref_t.shape != pol_t.shape:
                    raise ValueError(f"reference adapter {tuple(ref_t.shape)} != policy {tuple(pol_t.shape)}")
                if alpha == 1.0:
                    ref_t.copy_(pol_t)
                else:
                    ref_t.mul_(1.0 - alpha).add_(pol_t, alpha=alpha)

    @torch.no_grad()
    def grow_adapters(self, new_rank: int, seed: int) -> None:
        """Grow to ``new_rank`` with the new A rows ``lora.grow_rank`` gives the policy and zero B
        columns: the reference keeps its function and stays reset-compatible."""
        for li, (_, a, b) in enumerate(self._pairs()):
            r = a.shape[0]
            if new_rank <= r:
                raise ValueError(f"new rank {new_rank} must exceed the current rank {r}")
            extra = LoRALinear._init_rows(new_rank - r, a.shape[1], a, growth_generator(seed, li))
            setattr(self, f"A{li}", torch.cat([a, extra], dim=0))
            setattr(self, f"B{li}", torch.cat([b, b.new_zeros(b.shape[0], new_rank - r)], dim=1))


@dataclass
class ReferenceContext:
    """What every reference strategy is built from (one context for all: ``cls(ctx)``).

    ``temperature``/``banned``: how logprobs are taken (as the policy's); ``chunk``: rows per
    teacher-forced forward (the minibatch size); ``max_batch`` x ``max_len``: the largest rollout
    (sequences x completion tokens); ``adapter_reference``: hold the reference as the policy's frozen
    base + its own adapters instead of a deep copy.
    """

    policy: torch.nn.Module
    temperature: float
    banned: tuple[int, ...]
    chunk: int
    max_batch: int
    max_len: int
    device: torch.device
    adapter_reference: bool = False

    def frozen_model(self) -> torch.nn.Module:
        """A reference model equal to the policy now (an adapter reference or a frozen deep copy)."""
        return AdapterReference(self.policy) if self.adapter_reference else frozen_copy(self.policy)


class Reference:
    """Interface. ``model`` is None when the variant has no reference model.

    Subclasses are registered with ``@REFERENCES.register(name, per_rollout=..., model=...)``:
    ``per_rollout``: logprobs for the whole rollout exist before the update (needed to fold the KL
    into the reward); ``model``: a reference model exists at all; ``params``: a dataclass of its
    parameters (flat keys ``variant.<name>``; the instance arrives as ``params=`` and is ``self.params``).
    """

    model: torch.nn.Module | None = None
    moves = False  # True: the reference changes on its own (before_rollout), not only at resets

    def __init__(self, ctx: ReferenceContext, params: Any = None) -> None:
        self.ctx = ctx
        self.temperature = ctx.temperature
        self.banned = ctx.banned
        self.chunk = ctx.chunk
        self._flops_per_token = ctx.policy.flops_per_token
        self.params = params
        self.moved = False  # the reference model no longer equals the initial base

    # -- what the trainer asks of every strategy
    objective = "kl_to_reference"  # the output label of the KL anchor (B: "trust_region_vs_old")

    @property
    def exists(self) -> bool:
        """Whether a reference model exists (False for B): KL-to-reference metrics, resets."""
        return self.model is not None

    @property
    def is_base(self) -> bool:
        """The reference model still equals the initial base (then ``kl/base`` is ``kl/ref``)."""
        return self.exists and not self.moved

    def before_rollout(self, policy: torch.nn.Module, step: int) -> None:
        """Called before every rollout; a moving reference (``moves = True``) updates itself here
        and sets ``self.moved``."""

    def reset_to(
        self, policy: torch.nn.Module, alpha: float = 1.0, weights: dict[str, torch.Tensor] | None = None
    ) -> None:
        """A reference reset: pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref; ``weights`` (the policy's
        trainable parameters by name: ``reset.source=best``'s snapshot) stand in for pi_theta's."""
        reset_reference(self.model, policy, alpha, weights)
        self.moved = True

    def models(self) -> list[torch.nn.Module]:
        """Models that must follow the policy's topology (rank growth): the reference, if any."""
        return [] if self.model is None else [self.model]

    def anchor(self, logp_ref: torch.Tensor | None, logp_old: torch.Tensor) -> torch.Tensor:
        """The logprobs the KL term is taken against: the reference's (B: pi_old's)."""
        return logp_ref if logp_ref is not None else logp_old

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.model is None else self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None, moved: bool = False) -> None:
        """Restore the reference model; ``moved``: it had left the base before the checkpoint."""
        if self.model is not None:
            self.model.load_state_dict(state)
        self.moved = moved

    def forward_cost(self, acct: StepAccounting, batch: Rollout) -> None:
        """Charge one reference forward over ``batch`` to the step's accounting."""
        tokens = batch.key_mask.sum()  # a device scalar: StepAccounting reads it once per step
        acct.forward("ref", tokens, tokens * self._flops_per_token(batch.ids.shape[1]))

    def prepare(self, batch: Rollout, acct: StepAccounting) -> None:
        """Called once per rollout, before the update."""

    def logp(self, idx: torch.Tensor, mb: Rollout, acct: StepAccounting) -> torch.Tensor | None:
        """Reference logprobs (len(idx), L) of the minibatch rows ``idx``; None if no reference."""
        raise NotImplementedError


@REFERENCES.register("none", per_rollout=False, model=False)
class NoReference(Reference):
    """Variant B: no reference model is built; there is nothing to compute."""

    objective = "trust_region_vs_old"

    def logp(self, idx: torch.Tensor, mb: Rollout, acct: StepAccounting) -> None:
        return None


@REFERENCES.register("cached", per_rollout=True, model=True)
class CachedReference(Reference):
    """Variants A1 and C: one reference pass per rollout, reused by every epoch and minibatch."""

    def __init__(self, ctx: ReferenceContext, params: Any = None) -> None:
        super().__init__(ctx, params)
        self.model = ctx.frozen_model()
        self._cache: torch.Tensor | None = None

    def prepare(self, batch: Rollout, acct: StepAccounting) -> None:
        self._cache = chunked_logprobs(self.model, batch, self.temperature, self.banned, self.chunk)
        self.forward_cost(acct, batch)

    def logp(self, idx: torch.Tensor, mb: Rollout, acct: StepAccounting) -> torch.Tensor:
        return self._cache[idx]


@REFERENCES.register("buffered", per_rollout=True, model=True)
class BufferedReference(CachedReference):
    """Variant A2: as A1, but written into one preallocated (max_batch, max_len) buffer.

    ``allocations`` counts buffer allocations; it stays 1 for the whole run (tested).
    """

    def __init__(self, ctx: ReferenceContext, params: Any = None) -> None:
        super().__init__(ctx, params)
        self.buffer = torch.empty(ctx.max_batch, ctx.max_len, dtype=torch.float32, device=ctx.device)
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
        self.forward_cost(acct, batch)


@REFERENCES.register("recompute", per_rollout=False, model=True)
class RecomputeReference(Reference):
    """Variant A0: the deliberately wasteful baseline — a reference forward in every minibatch."""

    def __init__(self, ctx: ReferenceContext, params: Any = None) -> None:
        super().__init__(ctx, params)
        self.model = ctx.frozen_model()

    @torch.no_grad()
    def logp(self, idx: torch.Tensor, mb: Rollout, acct: StepAccounting) -> torch.Tensor:
        self.forward_cost(acct, mb)
        return token_logprobs(self.model, mb, self.temperature, self.banned)[0]


def build_reference(strategy: str, ctx: ReferenceContext, params: Any = None) -> Reference:
    """The reference strategy ``strategy`` (variant.reference) built as ``cls(ctx, params=...)`` with
    its parameters bound (``params``: the checked instance, or a mapping of its flat keys checked here).
    A strategy without a model (``none``) makes no copy of the policy."""
    ref = REFERENCES.build(strategy, params)(ctx)
    if REFERENCES.meta(strategy)["model"] != ref.exists:
        declared = REFERENCES.meta(strategy)["model"]
        raise TypeError(f"reference strategy {strategy!r} registered model={declared} but built model={ref.model!r}")
    return ref

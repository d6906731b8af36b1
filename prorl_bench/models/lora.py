"""LoRA adapters that can grow their rank (PEFT cannot: peft#825).

``LoRALinear`` wraps an ``nn.Linear`` (or transformers' ``Conv1D``, GPT-2's linear layer, whose
weight is stored transposed as (in, out)): y = base(x) + scaling * x A^T B^T with A: (r, in),
B: (out, r). B starts at zero, so attaching adapters does not change the policy's function.
``scaling`` is fixed at attach time (alpha / initial rank) and is *not* recomputed when the rank
grows — otherwise growth would rescale what the adapter already learned.

Growth to rank r' > r appends r' - r rows to A (small random values) and r' - r zero columns to B,
so B A and the policy's function are unchanged at the moment of growth. New tensors are new
``nn.Parameter`` objects; ``growth.py`` migrates the optimizer state onto them.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn

from prorl_bench.registry import ConfigError


def _conv1d_type() -> type | None:
    """transformers' ``Conv1D`` (a linear layer with weight (in, out): GPT-2 and its relatives), or
    None when transformers' layers were never imported (then no module can be one; a native run
    does not pay for importing transformers)."""
    mod = sys.modules.get("transformers.pytorch_utils")
    return getattr(mod, "Conv1D", None)


def linear_shape(m: nn.Module) -> tuple[int, int] | None:
    """(in_features, out_features) of an ``nn.Linear`` or a transformers ``Conv1D``; None for any
    other module (adapters wrap these two kinds only, as PEFT's ``all-linear`` does)."""
    if isinstance(m, nn.Linear):
        return m.in_features, m.out_features
    conv1d = _conv1d_type()
    if conv1d is not None and isinstance(m, conv1d):
        return m.weight.shape[0], m.weight.shape[1]  # Conv1D computes x @ W + b with W: (in, out)
    return None


def is_transposed(m: nn.Module) -> bool:
    """True for a ``Conv1D``: its weight is (in, out), the transpose of ``nn.Linear``'s (PEFT's
    ``fan_in_fan_out``)."""
    return not isinstance(m, nn.Linear) and linear_shape(m) is not None


def matmul_params(model: nn.Module) -> int:
    """Weights that take part in a per-token matmul: every ``nn.Linear`` / ``Conv1D`` weight plus
    LoRA A and B.

    Cached on the model (``flops_per_token`` asks on every forward pass); attaching or growing
    adapters invalidates the cache.
    """
    n = model.__dict__.get("_matmul_params")
    if n is None:
        n = sum(m.weight.numel() for m in model.modules() if linear_shape(m) is not None)
        n += sum(p.numel() for name, p in model.named_parameters() if "lora_" in name)
        model.__dict__["_matmul_params"] = n
    return n


def _invalidate(model: nn.Module) -> None:
    model.__dict__.pop("_matmul_params", None)


def adapted_shape(base: nn.Module) -> tuple[int, int]:
    """(in_features, out_features) of a layer an adapter may wrap; ValueError for any other."""
    shape = linear_shape(base)
    if shape is None:
        raise ValueError(f"adapters wrap nn.Linear or Conv1D layers, not {type(base).__name__}")
    return shape


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Module, rank: int, alpha: float, freeze_base: bool) -> None:
        super().__init__()
        self.base = base
        self.scaling = alpha / rank
        fan_in, fan_out = adapted_shape(base)
        self.lora_A = nn.Parameter(self._init_rows(rank, fan_in, base.weight))
        self.lora_B = nn.Parameter(base.weight.new_zeros(fan_out, rank))
        # (A, B) to use instead of the parameters: the adapter reference's weights (see
        # reference.AdapterReference), set only for the duration of a no-grad reference forward
        self.override: tuple[torch.Tensor, torch.Tensor] | None = None
        if freeze_base:
            base.requires_grad_(False)

    @staticmethod
    def _init_rows(n: int, fan_in: int, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        # Kaiming-uniform as in PEFT / the LoRA paper, bound 1/sqrt(fan_in)
        bound = 1.0 / math.sqrt(fan_in)
        rows = torch.empty(n, fan_in, dtype=like.dtype)
        rows.uniform_(-bound, bound, generator=generator)
        return rows.to(like.device)

    @property
    def rank(self) -> int:
        return self.lora_A.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = (self.lora_A, self.lora_B) if self.override is None else self.override
        return self.base(x) + self.scaling * ((x @ a.t()) @ b.t())

    @torch.no_grad()
    def grown(self, new_rank: int, generator: torch.Generator | None = None) -> tuple[nn.Parameter, nn.Parameter]:
        """New (A, B) parameters of rank ``new_rank``: old slices copied by index, B's new columns 0."""
        r = self.rank
        if new_rank <= r:
            raise ValueError(f"new rank {new_rank} must exceed the current rank {r}")
        extra = self._init_rows(new_rank - r, self.lora_A.shape[1], self.lora_A, generator)
        a = torch.cat([self.lora_A.detach(), extra], dim=0)
        b = torch.cat([self.lora_B.detach(), self.lora_B.new_zeros(self.lora_B.shape[0], new_rank - r)], dim=1)
        return nn.Parameter(a), nn.Parameter(b)


@dataclass
class GrownParam:
    """One parameter replaced by growth: ``old`` occupies ``new[slices]``."""

    old: nn.Parameter
    new: nn.Parameter
    slices: tuple[slice, ...]


def attach_lora(model: nn.Module, targets: list[str], rank: int, alpha: float, freeze_base: bool) -> int:
    """Replace every ``nn.Linear`` whose attribute name is in ``targets`` by a LoRALinear.

    Returns the number of wrapped layers; zero matches is an error (a typo in the target list).
    With ``freeze_base`` every non-adapter parameter of the model is frozen.
    """
    return wrap_linears(model, targets, lambda base: LoRALinear(base, rank, alpha, freeze_base), freeze_base)


ALL_LINEAR = "all-linear"  # PEFT's name: every nn.Linear / Conv1D except the output head
OUTPUT_HEADS = {"lm_head", "embed_out", "output"}  # the vocabulary projection: never adapted (as in PEFT)


def wrap_linears(model: nn.Module, targets: list[str], make, freeze_base: bool) -> int:
    """Replace every ``nn.Linear`` or transformers ``Conv1D`` (GPT-2's linear layers) whose
    attribute name is in ``targets`` (or every one but the output head, for ``["all-linear"]``, as
    PEFT does) by ``make(layer)`` (an adapter layer whose parameters are named ``lora_*``); freeze
    everything else with ``freeze_base``. Returns the number of wrapped layers; zero matches is an
    error naming what the targets did match (a typo, or layers that are not linear, such as an
    embedding)."""
    every = list(targets) == [ALL_LINEAR]
    wrapped, other = 0, set()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not (every and name not in OUTPUT_HEADS) and name not in targets:
                continue
            if linear_shape(child) is not None:
                setattr(parent, name, make(child))
                wrapped += 1
            elif not every:
                other.add(f"{name} ({type(child).__name__})")
    if wrapped == 0:
        why = f"; matched only {sorted(other)}, which adapters do not support (nn.Linear / Conv1D only)"
        raise ConfigError(
            f"invalid config value adapter.targets={list(targets)}: no nn.Linear / Conv1D layer of "
            f"{type(model).__name__} has these names{why if other else ''}"
        )
    _invalidate(model)
    if freeze_base:
        for pname, p in model.named_parameters():
            if "lora_" not in pname:
                p.requires_grad_(False)
    return wrapped


def lora_layers(model: nn.Module) -> list[tuple[str, LoRALinear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]


def adapter_rank(model: nn.Module) -> int:
    ranks = {m.rank for _, m in lora_layers(model)}
    if len(ranks) != 1:
        raise ValueError(f"adapters have inconsistent ranks {sorted(ranks)}")
    return ranks.pop()


def growth_generator(seed: int, layer_index: int) -> torch.Generator:
    """The generator of the new A rows of adapter layer ``layer_index`` (shared by policy and reference)."""
    return torch.Generator().manual_seed(seed * 100_003 + layer_index)


def grow_rank(models: list[nn.Module], new_rank: int, seed: int) -> list[list[GrownParam]]:
    """Grow every adapter of each model in ``models`` to ``new_rank`` with *identical* new rows.

    The policy and its reference grow together (same new A rows, zero B columns), so the reference
    keeps its function and stays shape-compatible with the policy for later resets.
    Returns, per model, the replaced parameters with the slice of the new tensor the old one occupies.
    """
    views = [m for m in models if hasattr(m, "grow_adapters")]  # adapter references: no modules of their own
    models = [m for m in models if not hasattr(m, "grow_adapters")]
    for v in views:
        v.grow_adapters(new_rank, seed)
    layers = [lora_layers(m) for m in models]
    names = [[n for n, _ in ls] for ls in layers]
    if any(n != names[0] for n in names):
        raise ValueError("models to grow together have different adapter layouts")
    out: list[list[GrownParam]] = [[] for _ in models]
    for li in range(len(layers[0])):
        gen = growth_generator(seed, li)
        state = gen.get_state()
        for mi, ls in enumerate(layers):
            layer = ls[li][1]
            r = layer.rank
            gen.set_state(state)  # same random rows for every model
            a, b = layer.grown(new_rank, gen)
            a.requires_grad_(layer.lora_A.requires_grad)
            b.requires_grad_(layer.lora_B.requires_grad)
            out[mi].append(GrownParam(layer.lora_A, a, (slice(0, r), slice(None))))
            out[mi].append(GrownParam(layer.lora_B, b, (slice(None), slice(0, r))))
            layer.lora_A, layer.lora_B = a, b
    for m in models:
        _invalidate(m)
    return out

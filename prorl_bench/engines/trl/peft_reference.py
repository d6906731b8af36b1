"""The reference of a PEFT LoRA policy: a frozen adapter named ``ref`` on the shared base, which TRL's
``GRPOTrainer`` uses as its reference whenever it exists (``use_adapter(model, "ref")``; TRL 1.16).

A reset with ``alpha = 1`` copies the trained adapter (its config, factors and scaling): the
reference's function equals the policy's bitwise.

A ``polyak`` reset (``alpha < 1``) mixes the two *functions*: with the effective weight update of an
adapter ``dW = scaling * B @ A`` on each adapted weight ``W0``, the new reference has

    dW_ref' = (1 - alpha) * dW_ref + alpha * dW_policy,

so its merged weight ``W0 + dW_ref'`` is ``(1 - alpha) * (W0 + dW_ref) + alpha * (W0 + dW_policy)`` —
the weight-space mix a full-model reference gets (``rl/resets.reset_reference``). Mixing the factors
A and B separately is not that (``((1-a) B1 + a B2) ((1-a) A1 + a A2)`` has cross terms), and a freshly
added adapter's random A would leak into it; neither happens here.

How it is stored, exactly and without an SVD: ``dW_ref'`` has rank at most ``rank(dW_ref) + r``, so the
``ref`` adapter holds the concatenated factors ``B' = [(1-a) s_ref B_ref, a s_pol B_pol]``,
``A' = [A_ref; A_pol]`` with scaling 1 (``lora_alpha = r``). Its rank grows by the policy's ``r`` at
every mix, up to a module's full rank ``min(d_out, d_in)``; from there the module's ``dW_ref'`` is stored
as itself against an identity factor (``B' = dW``, ``A' = I``, or the transpose), which stays exact. All
modules share one rank (PEFT's config); a module needing less is padded with zero rows and columns. So
the reference costs ``(k + 1) r`` ranks after ``k`` mixes (at most about twice the adapted weights), and
its forward pass grows with it. New adapter weights are created under ``torch.random.fork_rng``: a
reset neither depends on nor changes the global RNG.

Only plain LoRA on linear layers can be mixed (no DoRA, LoRA bias, ``modules_to_save`` or embedding
LoRA: refused with the reason); a copy (``alpha = 1``) works for any adapter PEFT can add.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from prorl_bench.engines.trl.config_map import REFERENCE_ADAPTER  # the name TRL's GRPOTrainer looks for

LAYOUT_KEYS = ("r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern")


def is_peft(model: torch.nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def lora_layers(model: torch.nn.Module) -> list[tuple[str, Any]]:
    from peft.tuners.lora import LoraLayer

    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]


def reference_params(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if f".{REFERENCE_ADAPTER}." in n}


def layout(model: torch.nn.Module) -> dict[str, Any] | None:
    """The ``ref`` adapter's shape-defining config fields (None when it does not exist)."""
    cfg = model.peft_config.get(REFERENCE_ADAPTER)
    if cfg is None:
        return None
    return {k: copy.deepcopy(getattr(cfg, k)) for k in LAYOUT_KEYS}


@contextmanager
def _own_rng(model: torch.nn.Module) -> Iterator[None]:
    """PEFT initialises a new adapter from the global RNG: keep the caller's RNG state as it was."""
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        yield


def ensure_reference(model: torch.nn.Module, want: dict[str, Any]) -> None:
    """A frozen ``ref`` adapter with the layout ``want`` (the policy's config otherwise), (re)created when
    the existing one differs; the trained adapter stays active. Its weights are the caller's to set."""
    active = model.active_adapter
    if layout(model) == want:
        return
    cfg = copy.deepcopy(model.peft_config[active])
    for k, v in want.items():
        setattr(cfg, k, copy.deepcopy(v))
    cfg.lora_dropout = 0.0  # a reference is deterministic (TRL disabled dropout only in the modules it saw)
    cfg.inference_mode = True
    with _own_rng(model):
        if REFERENCE_ADAPTER in model.peft_config:
            model.delete_adapter(REFERENCE_ADAPTER)
        model.add_adapter(REFERENCE_ADAPTER, cfg)
    model.set_adapter(active)  # adding an adapter must not change the trained one
    for p in reference_params(model).values():
        p.requires_grad_(False)


def copy_layout(model: torch.nn.Module) -> dict[str, Any]:
    cfg = model.peft_config[model.active_adapter]
    return {k: copy.deepcopy(getattr(cfg, k)) for k in LAYOUT_KEYS}


@torch.no_grad()
def reset_peft_reference(model: torch.nn.Module, alpha: float = 1.0) -> dict[str, Any]:
    """``ref`` <- the trained adapter (``alpha = 1``), or its function <- ``(1 - alpha) ref + alpha policy``
    (module docstring). Before the first reset the reference is the base (TRL's adapters-disabled
    reference), i.e. ``dW_ref = 0``. Returns ``{"ref_rank": ...}`` for the reset's record."""
    active = model.active_adapter
    if alpha == 1.0:
        ensure_reference(model, copy_layout(model))
        every = dict(model.named_parameters())
        for name, p in reference_params(model).items():
            p.copy_(every[name.replace(f".{REFERENCE_ADAPTER}.", f".{active}.")])
        return {"ref_rank": model.peft_config[REFERENCE_ADAPTER].r}
    _check_mixable(model, active)
    has_ref = REFERENCE_ADAPTER in model.peft_config
    mixed = {}
    for name, layer in lora_layers(model):
        if active not in layer.lora_A:
            continue
        parts_b = [layer.lora_B[active].weight.float() * (alpha * layer.scaling[active])]
        parts_a = [layer.lora_A[active].weight.float()]
        if has_ref and REFERENCE_ADAPTER in layer.lora_A:
            keep = (1.0 - alpha) * layer.scaling[REFERENCE_ADAPTER]
            parts_b.insert(0, layer.lora_B[REFERENCE_ADAPTER].weight.float() * keep)
            parts_a.insert(0, layer.lora_A[REFERENCE_ADAPTER].weight.float())
        mixed[name] = (torch.cat(parts_b, dim=1), torch.cat(parts_a, dim=0))
    rank = max(_needed_rank(b, a) for b, a in mixed.values())
    factors = {name: _factor_exactly(b, a, rank) for name, (b, a) in mixed.items()}  # before ref is replaced
    ensure_reference(model, {"r": rank, "lora_alpha": rank, "use_rslora": False, "rank_pattern": {},
                             "alpha_pattern": {}})  # fmt: skip
    for name, layer in lora_layers(model):
        if name not in factors:
            continue
        if layer.scaling[REFERENCE_ADAPTER] != 1.0:
            raise RuntimeError(
                f"{name}: the mixed reference adapter's scaling is {layer.scaling[REFERENCE_ADAPTER]}, not 1"
            )
        b, a = factors[name]
        layer.lora_B[REFERENCE_ADAPTER].weight.copy_(b)
        layer.lora_A[REFERENCE_ADAPTER].weight.copy_(a)
    return {"ref_rank": rank}


def _needed_rank(b: torch.Tensor, a: torch.Tensor) -> int:
    """The rank that holds ``b @ a`` exactly: the concatenated rank, or the full rank if that is less."""
    return min(b.shape[1], min(b.shape[0], a.shape[1]))


def _factor_exactly(b: torch.Tensor, a: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B', A') of width ``rank`` with ``B' @ A' = b @ a``: the factors themselves zero-padded, or — when
    their rank exceeds the module's full rank — the product against an identity, zero-padded."""
    d_out, d_in = b.shape[0], a.shape[1]
    if b.shape[1] <= min(d_out, d_in):
        pass
    elif d_in <= d_out:  # dW @ I_{d_in}
        b, a = b @ a, torch.eye(d_in, dtype=a.dtype, device=a.device)
    else:  # I_{d_out} @ dW
        b, a = torch.eye(d_out, dtype=b.dtype, device=b.device), b @ a
    pad = rank - b.shape[1]
    if pad < 0:
        raise RuntimeError(f"reference rank {rank} cannot hold a rank-{b.shape[1]} update")
    b = torch.cat([b, b.new_zeros(d_out, pad)], dim=1)
    a = torch.cat([a, a.new_zeros(pad, d_in)], dim=0)
    return b, a


def _check_mixable(model: torch.nn.Module, active: str) -> None:
    cfg = model.peft_config[active]
    why = []
    if getattr(cfg, "use_dora", False):
        why.append("DoRA (its magnitude vector is not a weight update)")
    if getattr(cfg, "lora_bias", False):
        why.append("lora_bias=True")
    if getattr(cfg, "modules_to_save", None):
        why.append(f"modules_to_save={cfg.modules_to_save}")
    if getattr(cfg, "trainable_token_indices", None):
        why.append("trainable_token_indices")
    for name, layer in lora_layers(model):
        linear = active in layer.lora_A and isinstance(layer.lora_A[active], torch.nn.Linear)
        if active in getattr(layer, "lora_embedding_A", {}) or (active in layer.lora_A and not linear):
            why.append(f"{name} is not a linear LoRA layer")
            break
    if why:
        raise ValueError(
            "an alpha-mix (polyak, reset alpha < 1) of a PEFT reference needs plain LoRA on linear layers; this "
            f"adapter has {', '.join(why)}. Use alpha=1 (a copy) or a full-model policy"
        )


def reference_state(model: torch.nn.Module) -> dict[str, Any]:
    """The ``ref`` adapter's layout and tensors (empty when it does not exist)."""
    lay = layout(model)
    if lay is None:
        return {}
    return {"layout": lay, "tensors": {n: p.detach().clone() for n, p in reference_params(model).items()}}


@torch.no_grad()
def load_reference_state(model: torch.nn.Module, state: dict[str, Any]) -> None:
    if not state:
        return
    if "layout" not in state:  # written before mixes were exact (engine checkpoints): a copy-layout adapter's tensors
        state = {"layout": copy_layout(model), "tensors": state}
    ensure_reference(model, state["layout"])
    params = reference_params(model)
    missing = sorted(set(state["tensors"]) ^ set(params))
    if missing:
        raise ValueError(f"the saved reference adapter does not fit this model: {missing[:5]}")
    for n, t in state["tensors"].items():
        params[n].copy_(t)

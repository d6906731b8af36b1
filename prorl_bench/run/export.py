"""Policy export formats: a run's checkpoint or an in-memory policy written as a Hugging Face, PEFT or
native directory, and read back. The command-line tools (``prorl-bench-export``, ``prorl-bench-sample``)
are ``cli/export.py``.

``prorl-bench-export RUN_DIR OUT`` reads the newest checkpoint of ``RUN_DIR`` (``torch.load`` with
``weights_only=True``) and writes, depending on ``model.kind``:

* ``hf_causal_lm``: a Hugging Face directory (``save_pretrained`` weights + config + the run's
  tokenizer) that ``transformers.AutoModelForCausalLM.from_pretrained(OUT)`` loads with the bench
  policy's logits. The fast path's fused layers (``layers.0.qkv``, ``fc1`` = gate|up) are split
  back into the HF names (``q_proj``/``k_proj``/``v_proj``, ``gate_proj``/``up_proj``), and LoRA
  adapters are merged into the weights (W + alpha/r * B A). A PEFT-format adapter directory is not
  written yet.
* ``native``: the documented native format, loaded by :func:`load_native`:

  - ``model.safetensors``: the ``TransformerPolicy`` state dict (LoRA merged, names as in
    ``prorl_bench.models.model``), fp32;
  - ``config.json``: ``{"format": "prorl-bench-native", "version": 1, "model": {ModelConfig fields},
    "vocab_size": int}``;
  - ``tokenizer.json``: ``{"kind": "char", "pad": 0, "bos": 1, "eos": 2, "first": 32, "last": 126}``
    (id ``3 + ord(c) - 32`` for a printable ASCII character ``c``).

``prorl-bench-sample RUN_DIR_OR_EXPORT --prompt TEXT [--n 4] [--temperature 1.0]`` samples
completions from a run's (or an exported directory's) policy with the bench's own sampler.

Routed runs (``adapter=dual_lora``): both tools take ``--mode retain|forget|both`` or ``--scales R,F``
(the retain and forget adapters' scales). Sampling defaults to both at 1; export requires a choice
and folds the scaled adapters into the weights (``dual_lora.fold_dual``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from prorl_bench.config import AdapterKind, Config, ConfigError, ModelConfig, ModelKind
from prorl_bench.models.lora import LoRALinear, attach_lora, grow_rank, is_transposed, lora_layers
from prorl_bench.run.checkpoint import checkpoint_paths, load_verified

NATIVE_FORMAT = "prorl-bench-native"


def _config_from_dict(d: dict[str, Any]) -> Config:
    from omegaconf import OmegaConf

    from prorl_bench.config import to_config

    return to_config(OmegaConf.create(_enum_names(Config, d)))  # options' parameters: flat keys (as_dict)


def _enum_names(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """checkpoint.config_dict stores enum *values*; OmegaConf's structured merge wants enum members."""
    import enum
    import typing

    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for k, v in d.items():
        t = hints.get(k)
        if isinstance(t, type) and issubclass(t, enum.Enum) and v is not None:
            out[k] = t(v)
        elif isinstance(t, type) and dataclasses.is_dataclass(t) and isinstance(v, dict):
            out[k] = _enum_names(t, v)
        else:
            out[k] = v
    return out


def load_run(run_dir: str | Path) -> tuple[nn.Module, Any, Config, int]:
    """Rebuild the policy of ``run_dir``'s newest checkpoint on CPU: (policy, tokenizer, config, step).

    Raises ConfigError if the directory has no checkpoint (``checkpoint.every`` must be > 0).
    """
    from prorl_bench.models.model import TransformerPolicy
    from prorl_bench.run.policies import build_tokenizer

    paths = checkpoint_paths(Path(run_dir))
    if not paths:
        raise ConfigError(f"{run_dir}: no checkpoints/step_*.pt (run with checkpoint.every > 0)")
    blob = load_verified(paths[-1])  # checksum + safe loading; a damaged file is named
    cfg = _config_from_dict(blob["config"])
    tok = build_tokenizer(cfg)
    if cfg.model.kind == ModelKind.hf_causal_lm:
        from prorl_bench.models.hf_model import load_policy

        targets = list(cfg.adapter.params.targets) if cfg.adapter.kind != AdapterKind.none else []
        policy = load_policy(cfg.model, torch.device("cpu"), targets)
    else:
        policy = TransformerPolicy(cfg.model, tok.vocab_size)
    if cfg.adapter.kind == AdapterKind.lora:
        d = cfg.adapter.params
        attach_lora(policy, list(d.targets), d.rank, d.alpha, d.freeze_base)
        if blob.get("adapter_rank", d.rank) > d.rank:
            grow_rank([policy], blob["adapter_rank"], seed=0)
    _attach_dual(policy, cfg)
    policy.load_state_dict(blob["policy"])
    policy.eval()
    return policy, tok, cfg, int(blob["step"])


@torch.no_grad()
def merged_state_dict(policy: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's state dict with every LoRALinear folded into a plain Linear's names:
    ``X.weight = X.base.weight + scaling * X.lora_B @ X.lora_A`` (transposed for a Conv1D base;
    ``X.bias = X.base.bias``)."""
    sd = {k: v.detach().float().cpu().clone() for k, v in policy.state_dict().items()}
    for name, mod in lora_layers(policy):
        assert isinstance(mod, LoRALinear)
        for k in [k for k in sd if k.startswith(name + ".base.") or k.startswith(name + ".lora_")]:
            del sd[k]
        delta = mod.scaling * (mod.lora_B.float() @ mod.lora_A.float())  # (out, in)
        if is_transposed(mod.base):  # GPT-2's Conv1D stores its weight as (in, out)
            delta = delta.t()
        sd[f"{name}.weight"] = (mod.base.weight.float() + delta).cpu()
        if mod.base.bias is not None:
            sd[f"{name}.bias"] = mod.base.bias.detach().float().cpu().clone()
    return sd


def _fast_to_hf(sd: dict[str, torch.Tensor], policy: nn.Module) -> dict[str, torch.Tensor]:
    """Split FastLlamaPolicy's fused names back into transformers' LLaMA-family names."""
    h, hkv, dh = policy.h, policy.hkv, policy.dh
    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm"]}
    out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(policy.n_layers):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        out[q + "input_layernorm.weight"] = sd[p + "in_norm"]
        out[q + "post_attention_layernorm.weight"] = sd[p + "post_norm"]
        for kind in ("weight", "bias"):
            if p + "qkv." + kind in sd:
                qw, kw, vw = torch.split(sd[p + "qkv." + kind], [h * dh, hkv * dh, hkv * dh])
                out[q + "self_attn.q_proj." + kind] = qw
                out[q + "self_attn.k_proj." + kind] = kw
                out[q + "self_attn.v_proj." + kind] = vw
            if p + "proj." + kind in sd:
                out[q + "self_attn.o_proj." + kind] = sd[p + "proj." + kind]
        gate, up = sd[p + "fc1.weight"].chunk(2)
        out[q + "mlp.gate_proj.weight"] = gate
        out[q + "mlp.up_proj.weight"] = up
        out[q + "mlp.down_proj.weight"] = sd[p + "fc2.weight"]
    return out


def hf_state_dict(policy: nn.Module) -> dict[str, torch.Tensor]:
    """HF-named, LoRA-merged weights of an HF policy (either implementation)."""
    from prorl_bench.models.fast_llama import FastLlamaPolicy

    sd = merged_state_dict(policy)
    if isinstance(policy, FastLlamaPolicy):
        return _fast_to_hf(sd, policy)
    return {k.removeprefix("hf."): v for k, v in sd.items()}


def export_hf(policy: nn.Module, cfg: Config, out: str | Path) -> Path:
    """Write ``save_pretrained`` weights + tokenizer of an HF policy to ``out`` (LoRA merged)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    src = str(cfg.model.path)
    hf_cfg = AutoConfig.from_pretrained(src, local_files_only=True)
    model = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
    sd = hf_state_dict(policy)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    tied = {"lm_head.weight"} if getattr(hf_cfg, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"export: weight names do not match {type(model).__name__}: missing {missing}, unexpected {unexpected}"
        )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    bench_tok = bench_tokenizer(cfg)
    set_generation_defaults(model, bench_tok)
    model.save_pretrained(out)
    export_tokenizer(bench_tok, out)
    if cfg.adapter.kind == AdapterKind.lora and cfg.adapter.params.freeze_base:
        export_peft(policy, cfg, out / PEFT_DIR)  # the adapters alone, for PEFT users
    return out


PROBE = "Q: 12 + 30 = ? A: 42."  # a prompt to compare the bench's ids with the exported tokenizer's


def bench_tokenizer(cfg: Config) -> Any:
    """The run's ``HFTokenizer`` as training built it (``task.chat_template`` applied)."""
    from prorl_bench.run.policies import build_tokenizer

    return build_tokenizer(cfg)


def set_generation_defaults(model: nn.Module, tok: Any) -> None:
    """``generate`` on the export decodes as the bench's sampler does: it stops at the bench's EOS,
    pads with its PAD, and never emits PAD or BOS (``banned_ids``, removed from the bench's sampling
    distribution; ``suppress_tokens`` in ``generation_config.json``)."""
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id = tok.EOS, tok.PAD
    if tok.BOS is not None:
        gc.bos_token_id = tok.BOS
    gc.suppress_tokens = list(tok.banned_ids) or None


def export_tokenizer(tok: Any, out: str | Path) -> None:
    """Save the run's tokenizer so that plain ``AutoTokenizer.from_pretrained(out)(text)`` gives the
    bench's prompt ids: the bench puts BOS in front of a (non-chat) prompt and encodes the text without
    special tokens, so the exported tokenizer is made to add BOS itself — its own ``add_bos_token``
    (the post-processor template transformers builds from it), saved with it. Chat prompts are
    unchanged: ``apply_chat_template`` renders BOS from the template and encodes without special
    tokens. Raises ValueError if the tokenizer cannot be made to agree (checked on ``PROBE``)."""
    hf = tok.hf
    want = ([tok.BOS] if tok.BOS is not None else []) + tok.encode(PROBE)
    if list(hf(PROBE)["input_ids"]) != want:
        for attr, value in (("add_bos_token", tok.BOS is not None), ("add_eos_token", False)):
            if hasattr(hf, attr):
                setattr(hf, attr, value)  # the tokenizer rebuilds its post-processor
                hf.init_kwargs[attr] = value  # and saves the setting with it
    got = list(hf(PROBE)["input_ids"])
    if got != want:
        raise ValueError(f"export: {type(hf).__name__} encodes {PROBE!r} as {got}, the bench as {want} (BOS by hand)")
    hf.save_pretrained(out)


PEFT_DIR = "peft_adapter"  # inside an HF export: the LoRA adapters alone, in PEFT's format


_FUSED = {"qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")), "proj": ("self_attn", ("o_proj",)),
          "fc1": ("mlp", ("gate_proj", "up_proj")), "fc2": ("mlp", ("down_proj",))}  # fmt: skip


@torch.no_grad()
def peft_adapter_state(policy: nn.Module) -> tuple[dict[str, torch.Tensor], list[str], int, float]:
    """The LoRA adapters under PEFT's names: (state dict, target module names, rank, lora_alpha).

    PEFT computes its scaling as lora_alpha / r; the bench keeps alpha / initial rank after growth,
    so lora_alpha = scaling * current rank reproduces the policy exactly. A fused fast-path layer
    becomes its HF projections, each with the shared A and its rows of B (the same function).
    """
    from prorl_bench.models.fast_llama import FastLlamaPolicy

    fast = isinstance(policy, FastLlamaPolicy)
    sd: dict[str, torch.Tensor] = {}
    targets: set[str] = set()
    ranks, scalings = set(), set()
    for name, mod in lora_layers(policy):
        a, b = mod.lora_A.detach().float().cpu(), mod.lora_B.detach().float().cpu()
        ranks.add(a.shape[0])
        scalings.add(mod.scaling)
        if fast:
            layer, leaf = name.split(".")[1], name.split(".")[-1]
            block, hf_leaves = _FUSED[leaf]
            sizes = {"qkv": [policy.h * policy.dh, policy.hkv * policy.dh, policy.hkv * policy.dh]}.get(leaf)
            parts = torch.split(b, sizes) if sizes else b.chunk(len(hf_leaves))
            for hf_leaf, b_part in zip(hf_leaves, parts):
                key = f"base_model.model.model.layers.{layer}.{block}.{hf_leaf}"
                sd[f"{key}.lora_A.weight"], sd[f"{key}.lora_B.weight"] = a.clone(), b_part.contiguous()
                targets.add(hf_leaf)
        else:
            key = "base_model.model." + name.removeprefix("hf.")
            sd[f"{key}.lora_A.weight"], sd[f"{key}.lora_B.weight"] = a.clone(), b.clone()
            targets.add(name.rsplit(".", 1)[-1])
    if len(ranks) != 1 or len(scalings) != 1:
        raise ValueError(f"export: adapters with mixed ranks {sorted(ranks)} or scalings {sorted(scalings)}")
    r = ranks.pop()
    return sd, sorted(targets), r, scalings.pop() * r


def export_peft(policy: nn.Module, cfg: Config, out: str | Path) -> Path:
    """Write the LoRA adapters as a PEFT directory (adapter_config.json + adapter_model.safetensors)
    that ``peft.PeftModel.from_pretrained(base, out)`` loads onto ``model.path`` with the policy's
    logits (tested). Only for a frozen base: otherwise the base changed and the adapters alone are
    not the policy."""
    from safetensors.torch import save_file

    sd, targets, r, lora_alpha = peft_adapter_state(policy)
    # PEFT's flag for Conv1D bases (GPT-2): weight (in, out); the adapters' A and B are the same
    transposed = {is_transposed(m.base) for _, m in lora_layers(policy)}
    if len(transposed) != 1:
        raise ValueError("export: adapters on both nn.Linear and Conv1D layers; PEFT has one fan_in_fan_out flag")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(cfg.model.path),
        "r": r, "lora_alpha": lora_alpha, "target_modules": targets, "lora_dropout": 0.0, "bias": "none",
        "fan_in_fan_out": transposed.pop(), "inference_mode": True, "modules_to_save": None, "use_rslora": False,
        "use_dora": False, "init_lora_weights": True,
    }  # fmt: skip
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def export_native(policy: nn.Module, cfg: Config, vocab_size: int, out: str | Path) -> Path:
    """Write the native format (module docstring) to ``out``."""
    from safetensors.torch import save_file

    from prorl_bench.models.tokenizers import CharTokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.contiguous() for k, v in merged_state_dict(policy).items()}
    save_file(sd, str(out / "model.safetensors"))
    model_d = json.loads(json.dumps(dataclasses.asdict(cfg.model), default=lambda e: e.value))
    meta = {"format": NATIVE_FORMAT, "version": 1, "model": model_d, "vocab_size": vocab_size}
    (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    t = CharTokenizer()
    tok = {"kind": "char", "pad": t.PAD, "bos": t.BOS, "eos": t.EOS, "first": t._FIRST, "last": t._LAST}
    (out / "tokenizer.json").write_text(json.dumps(tok, indent=2) + "\n")
    return out


def load_native(path: str | Path) -> tuple[nn.Module, Any]:
    """Load a native export: (TransformerPolicy in eval mode on CPU, CharTokenizer)."""
    from safetensors.torch import load_file

    from prorl_bench.config import HFImpl
    from prorl_bench.models.model import TransformerPolicy
    from prorl_bench.models.tokenizers import CharTokenizer

    p = Path(path)
    meta = json.loads((p / "config.json").read_text())
    if meta.get("format") != NATIVE_FORMAT:
        raise ConfigError(f"{p / 'config.json'}: format {meta.get('format')!r} is not {NATIVE_FORMAT!r}")
    md = dict(meta["model"])
    md["kind"], md["impl"] = ModelKind(md["kind"]), HFImpl(md["impl"])
    policy = TransformerPolicy(ModelConfig(**md), int(meta["vocab_size"]))
    policy.load_state_dict(load_file(str(p / "model.safetensors")))
    return policy.eval(), CharTokenizer()


class NonFiniteWeightsError(ValueError):
    """The weights to export hold NaN or infinity (a diverged run): nothing is written."""


def check_finite(policy: nn.Module) -> None:
    """Raise NonFiniteWeightsError naming every floating tensor of ``policy`` with a NaN or inf entry."""
    bad = [k for k, v in policy.state_dict().items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise NonFiniteWeightsError(f"NonFiniteWeightsError: non-finite weights (NaN or inf) in {shown}; not exported")


def export_policy(policy: nn.Module, cfg: Config, tok: Any, out: str | Path) -> Path:
    """Export an in-memory policy (any device) to ``out`` in the format for ``cfg.model.kind``; refuses
    non-finite weights (NonFiniteWeightsError) before writing anything."""
    if cfg.adapter.kind == AdapterKind.dual_lora:
        raise ConfigError(
            "invalid config value adapter=dual_lora for export: pick the adapters' scales (prorl-bench-export "
            "--mode retain|forget|both or --scales R,F) so they are folded into the weights"
        )
    check_finite(policy)
    if cfg.model.kind == ModelKind.hf_causal_lm:
        return export_hf(policy, cfg, out)
    return export_native(policy, cfg, tok.vocab_size, out)


def export_run(run_dir: str | Path, out: str | Path, scales: tuple[float, float] | None = None) -> Path:
    """Export ``run_dir``'s newest checkpoint to ``out`` (format per model.kind; see module doc).
    ``scales``: a routed (dual_lora) run's (retain, forget) adapter scales, folded into the weights."""
    policy, tok, cfg, _ = load_run(run_dir)
    policy, cfg = _fold_routed(policy, cfg, scales)
    return export_policy(policy, cfg, tok, out)


def _attach_dual(policy: nn.Module, cfg: Config) -> None:
    """A routed run's checkpoint holds retain and forget adapters: attach them before loading."""
    if cfg.adapter.kind == AdapterKind.dual_lora:
        from prorl_bench.models.dual_lora import attach_dual_lora

        d = cfg.adapter.params
        attach_dual_lora(policy, list(d.targets), d.retain_rank, d.forget_rank, d.alpha, d.freeze_base)


def _fold_routed(policy: nn.Module, cfg: Config, scales: tuple[float, float] | None) -> tuple[nn.Module, Config]:
    """A routed run exported at ``scales``: the adapters folded into the weights (``dual_lora.fold_dual``)
    and the config's adapter set to none, so every format writes a plain model. Scales are required
    for a routed run (which model is deployed is the study's question) and refused for any other."""
    import copy

    from prorl_bench.config import AdapterConfig
    from prorl_bench.models.dual_lora import fold_dual

    if cfg.adapter.kind != AdapterKind.dual_lora:
        if scales is not None:
            raise ConfigError("--mode/--scales need a routed run (adapter=dual_lora); this run has adapter="
                              f"{cfg.adapter.kind.value}")  # fmt: skip
        return policy, cfg
    if scales is None:
        raise ConfigError(
            "a routed run (adapter=dual_lora) is exported with chosen adapter scales: pass --mode retain|forget|both "
            "or --scales R,F (retain = the forget adapter ablated)"
        )
    fold_dual(policy, scales)
    plain = copy.copy(cfg)  # no re-validation: only the adapter changes, to what the folded policy now is
    object.__setattr__(plain, "adapter", AdapterConfig())
    return policy, plain

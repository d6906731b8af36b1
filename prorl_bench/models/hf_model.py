"""Hugging Face causal LMs from a local directory, behind the native policy's interface.

The trainer, rollout, reference and warm-up code talk to a policy through four calls

* ``forward(ids, key_mask) -> logits``           teacher-forced, ids/key_mask (B, T), logits (B, T, V)
* ``new_cache(batch, max_len, device)``          an empty KV cache for ``generate``
* ``forward_cached(ids, key_mask, pos, cache)``  append ids (B, t) at ``cache.length``; logits (B, t, V)
* ``flops_per_token(context)`` / ``matmul_params()``  FLOP accounting (forward, per token)

and to a tokenizer through ``PAD/BOS/EOS``, ``banned_ids``, ``vocab_size``, ``encode``, ``decode``,
``encode_prompts`` (left-padded, BOS-prefixed). :class:`HFCausalLMPolicy` and :class:`HFTokenizer`
implement them for any ``AutoModelForCausalLM`` directory; ``prorl_bench.models.fast_llama`` is a faster
implementation of the same interface for LLaMA-family checkpoints (same weights, same math).

Padding: a model without a pad token pads with EOS (the usual HF convention). Padded positions are
masked out by ``key_mask`` and completion masks are tracked from done flags, so PAD == EOS is safe.
Nothing is downloaded: loading uses ``local_files_only=True`` and a missing path is a ConfigError.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from prorl_bench.config import ConfigError, HFImpl, ModelConfig
from prorl_bench.config.chat_template import resolve_chat_template
from prorl_bench.models.lora import matmul_params
from prorl_bench.models.model import positions


def _require_transformers():
    try:
        import transformers  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "model.kind=hf_causal_lm needs the 'hf' extra (transformers, tokenizers): pip install 'prorl-bench[hf]'"
        ) from e


class HFTokenizer:
    """Wraps a ``transformers`` tokenizer with the CharTokenizer interface.

    ``encode`` adds no special tokens; prompts get the model's BOS (if it has one) in front. ``decode``
    stops at the first EOS, drops special tokens and strips surrounding whitespace (SentencePiece
    tokenizers decode a leading space), which is what the verifiers compare.
    """

    def __init__(
        self, hf_tok: Any, chat: bool = False, chat_key: str = "task.prompt_style=chat",
        chat_template: str | None = None, plain: str = "prompt_style=question|compact",
    ) -> None:  # fmt: skip
        """``chat``: prompts go through the chat template — ``chat_template`` (``task.chat_template``,
        text or a file) if given, else the tokenizer's own. ``chat_key``: the setting that asked for
        chat prompts, and ``plain`` its alternative without a template (both named in the error)."""
        if hf_tok.eos_token_id is None:
            raise ConfigError("model.path: the tokenizer has no eos_token; allowed: a tokenizer with an EOS token")
        if chat_template is not None:
            hf_tok.chat_template = resolve_chat_template(chat_template)
        if chat and not getattr(hf_tok, "chat_template", None):
            raise ConfigError(
                f"{chat_key}: the tokenizer in model.path has no chat_template; allowed here: {plain}, "
                "task.chat_template=FILE_OR_TEMPLATE, or an instruction-tuned checkpoint"
            )
        self.hf = hf_tok
        self.chat = chat
        self.EOS: int = int(hf_tok.eos_token_id)
        self.PAD: int = int(hf_tok.pad_token_id) if hf_tok.pad_token_id is not None else self.EOS
        self.BOS: int | None = int(hf_tok.bos_token_id) if hf_tok.bos_token_id is not None else None

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def banned_ids(self) -> tuple[int, ...]:
        """PAD and BOS are never sampled (unless one of them is the EOS id)."""
        return tuple(sorted({i for i in (self.PAD, self.BOS) if i is not None and i != self.EOS}))

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if self.EOS in ids:
            ids = ids[: ids.index(self.EOS)]
        return self.hf.decode(ids, skip_special_tokens=True).strip()

    def chat_ids(self, prompt: str) -> list[int]:
        """The prompt as one user turn through the chat template, with the assistant's turn opened
        (``add_generation_prompt``); the template supplies BOS and role markers itself."""
        text = self.hf.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        return list(self.hf.encode(text, add_special_tokens=False))

    def encode_prompts(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pad prompts (BOS-prefixed if the model has a BOS). ids (B, P) long, mask (B, P) bool."""
        if self.chat:
            seqs = [self.chat_ids(p) for p in prompts]
        else:
            head = [self.BOS] if self.BOS is not None else []
            seqs = [head + self.encode(p) for p in prompts]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.PAD, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.bool)
        for row, s in enumerate(seqs):
            if s:
                ids[row, width - len(s) :] = torch.tensor(s)
                mask[row, width - len(s) :] = True
        return ids, mask


@dataclass
class HFKVCache:
    """A transformers ``DynamicCache`` plus the key mask of every cached position (B, T_max)."""

    kv: Any
    key_mask: torch.Tensor
    length: int = 0


def cache_argument(model: nn.Module) -> str:
    """The name under which ``model.forward`` takes (and its output returns) the KV cache: ``cache``
    since transformers 5.x deprecated ``past_key_values`` (a FutureWarning on every decoding step),
    ``past_key_values`` before. Either way the object passed is a ``DynamicCache``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class HFCausalLMPolicy(nn.Module):
    """Any ``AutoModelForCausalLM`` behind the policy interface (uses the module's own forward)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.hf = model
        c = model.config
        self.n_layers = int(c.num_hidden_layers)
        self.attn_dim = int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads) * int(
            c.num_attention_heads
        )
        self.max_positions = int(getattr(c, "max_position_embeddings", 1 << 30))
        self._cache_arg = cache_argument(model)

    @staticmethod
    def positions(key_mask: torch.Tensor) -> torch.Tensor:
        return positions(key_mask)

    def forward(self, ids: torch.Tensor, key_mask: torch.Tensor, keep: int = 0) -> torch.Tensor:
        """Teacher-forced logits (B, T, V), or the last ``keep`` positions' if keep > 0 (HF's
        ``logits_to_keep``); positions count real tokens (left padding is skipped)."""
        out = self.hf(
            input_ids=ids,
            attention_mask=key_mask.long(),
            position_ids=self.positions(key_mask),
            use_cache=False,
            logits_to_keep=keep,
        )
        return out.logits

    def new_cache(self, batch: int, max_len: int, device: torch.device) -> HFKVCache:
        from transformers import DynamicCache

        return HFKVCache(DynamicCache(), torch.zeros(batch, max_len, dtype=torch.bool, device=device))

    def forward_cached(
        self, ids: torch.Tensor, key_mask: torch.Tensor, pos: torch.Tensor, cache: HFKVCache
    ) -> torch.Tensor:
        start, t = cache.length, ids.shape[1]
        cache.key_mask[:, start : start + t] = key_mask
        out = self.hf(
            input_ids=ids,
            attention_mask=cache.key_mask[:, : start + t].long(),
            position_ids=pos,
            use_cache=True,
            **{self._cache_arg: cache.kv},
        )
        cache.kv = getattr(out, self._cache_arg)
        cache.length = start + t
        return out.logits

    def matmul_params(self) -> int:
        """Weights that take part in a matmul per token (linear layers incl. the LM head)."""
        return matmul_params(self)

    def flops_per_token(self, context: int) -> float:
        """Forward FLOPs per token: 2 per matmul weight + attention scores/values at ``context``."""
        return 2.0 * self.matmul_params() + 4.0 * self.n_layers * context * self.attn_dim


def fingerprint(path: str | Path) -> dict[str, Any]:
    """Identify a checkpoint directory's contents (names, sizes, mtimes) for the warm-up cache key."""
    p = Path(path)
    h = hashlib.sha256()
    for f in sorted(p.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    return {"path": str(p.resolve()), "files": h.hexdigest()[:16]}


def load_tokenizer(path: str | Path, chat: bool = False, **kwargs: Any) -> HFTokenizer:
    """The checkpoint's tokenizer; ``chat``: prompts go through its chat template (``kwargs``: see
    :class:`HFTokenizer`)."""
    _require_transformers()
    from transformers import AutoTokenizer

    return HFTokenizer(AutoTokenizer.from_pretrained(str(path), local_files_only=True), chat=chat, **kwargs)


def _is_llama_family(model: nn.Module) -> bool:
    return getattr(model.config, "model_type", "") in {"llama", "mistral", "qwen2"}


FAST_NAMES = frozenset({"qkv", "proj", "fc1", "fc2"})  # the fast path's (fused) linear layer names


def _auto_impl(llama_family: bool, device: torch.device, fused_names: list[str], hf_names: list[str]) -> HFImpl:
    """What ``model.impl=auto`` runs: whichever forward was measured faster on this device type
    (docs/performance.md), within what the LoRA targets allow.

    CUDA (H100, bf16): the fast path, 145 vs 194 ms/step at 0.84M parameters and 665-870 vs
    767-1209 ms/step at 0.47B. CPU: HF's own forward (270 vs 296, 293 vs 362 ms/step). LoRA targets
    under HF names (``q_proj``) exist only in HF's forward; the fused names (``qkv``, ``fc1``) only in
    the fast path; non-LLaMA families have no fast path."""
    if not llama_family or hf_names:
        return HFImpl.hf
    return HFImpl.fast if device.type == "cuda" or fused_names else HFImpl.hf


def load_policy(cfg: ModelConfig, device: torch.device, adapter_targets: Sequence[str] = ()) -> nn.Module:
    """Load ``cfg.path`` in fp32 (bf16 is applied by autocast) and wrap it per ``cfg.impl``.

    ``adapter_targets``: LoRA target names the run will attach. Names other than the fast path's
    (HF names such as ``q_proj``) make ``impl=auto`` use HF's forward (the fast path fuses q/k/v and
    gate/up, so those layers do not exist there); with ``impl=fast`` they are a ConfigError."""
    _require_transformers()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    if cfg.path is None or not Path(cfg.path).is_dir():
        raise ConfigError(f"invalid config value model.path={cfg.path!r}: allowed a local Hugging Face model directory")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        str(cfg.path), local_files_only=True, dtype=torch.float32, attn_implementation="sdpa"
    )
    model.config.use_cache = False
    if cfg.dropout == 0.0:  # the A0 = A1 = A2 invariant needs a deterministic forward
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
        if hasattr(model.config, "attention_dropout"):
            model.config.attention_dropout = 0.0
    impl = cfg.impl
    hf_names = sorted(set(adapter_targets) - FAST_NAMES - {"all-linear"})  # all-linear exists on every path
    fused_names = sorted(set(adapter_targets) & FAST_NAMES)
    if impl == HFImpl.auto:
        impl = _auto_impl(_is_llama_family(model), device, fused_names, hf_names)
    elif impl == HFImpl.fast and hf_names:
        raise ConfigError(
            f"invalid config value adapter.targets={list(adapter_targets)}: {hf_names} do not exist under "
            f"model.impl=fast (fused layers {sorted(FAST_NAMES)}); use model.impl=hf or auto for HF names"
        )
    if impl == HFImpl.fast:
        from prorl_bench.models.fast_llama import FastLlamaPolicy

        policy: nn.Module = FastLlamaPolicy.from_hf(model)
    else:
        policy = HFCausalLMPolicy(model)
    return policy.to(device)

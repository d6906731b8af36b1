"""Which tokenizer and base policy a run starts from, for every ``model.kind``.

* ``native``: the character tokenizer and a :class:`TransformerPolicy`; the supervised warm-up
  (``base.py``) runs unless ``warmup.enabled=false`` (then the policy starts from random weights).
* ``hf_causal_lm``: the checkpoint's tokenizer and weights from ``model.path``. A pretrained model is
  already a base, so the warm-up is skipped unless ``warmup.enabled=true``; then the same cached
  warm-up fine-tunes the loaded model on the task (cache keyed by the checkpoint's fingerprint too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from prorl_bench.config import AdapterKind, Config, ConfigError, DecodeImpl, ModelKind, PromptStyle
from prorl_bench.models.model import TransformerPolicy
from prorl_bench.models.tokenizers import CharTokenizer
from prorl_bench.run.base import load_or_train_base
from prorl_bench.tasks.base import Task


def build_tokenizer(cfg: Config):
    """The tokenizer for ``cfg.model`` (CharTokenizer or hf_model.HFTokenizer)."""
    if cfg.model.kind == ModelKind.hf_causal_lm:
        from prorl_bench.models.hf_model import load_tokenizer

        chat, key, plain = chat_setting(cfg)
        return load_tokenizer(cfg.model.path, chat=chat, chat_key=key, plain=plain,
                              chat_template=cfg.task.chat_template)  # fmt: skip
    return CharTokenizer()


def chat_setting(cfg: Config) -> tuple[bool, str, str]:
    """(prompts go through a chat template, the setting that says so, its alternative without one):
    a missing template is blamed on the key that asked for it."""
    t = cfg.task
    if t.name == "code":
        return t.params.prompt_style == PromptStyle.chat, "task.prompt_style=chat", "task.prompt_style=question"
    if t.name == "math_jsonl":
        return True, "task=math_jsonl", "a model whose tokenizer has one"
    rg = t.name == "reasoning_gym" and t.params.prompt_style == PromptStyle.chat
    return rg, "task.prompt_style=chat", "task.prompt_style=question|compact"


def warmup_enabled(cfg: Config) -> bool:
    if cfg.warmup.enabled is not None:
        return cfg.warmup.enabled
    return cfg.model.kind == ModelKind.native


def decode_impl(cfg: Config, policy: torch.nn.Module, device: torch.device) -> str:
    """``hardware.decode`` resolved for this policy and device (``auto``: see config.DecodeImpl)."""
    from prorl_bench.models.decode import supports_static

    want = cfg.hardware.decode
    if want == DecodeImpl.auto:
        if not supports_static(policy):
            return DecodeImpl.dynamic.value
        return DecodeImpl.graph.value if device.type == "cuda" else DecodeImpl.static.value
    if want != DecodeImpl.dynamic and not supports_static(policy):
        raise ConfigError(
            f"invalid config value hardware.decode={want.value!r}: {type(policy).__name__} has no static decode "
            "step (the native policy and model.impl=fast have one); allowed here: auto, dynamic"
        )
    return want.value


def load_base_policy(
    cfg: Config, task: Task, tok, device: torch.device, cache_root: Path, stop=None, progress: bool = False
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The policy RL starts from, on ``device``, and a description of where it came from.
    ``stop``, ``progress``: see ``base.train_base`` (a warm-up stops early when the run is told to
    stop; it reports its progress).

    The policy carries the run's performance settings as attributes that ``rollout`` reads:
    ``decode_impl`` (``hardware.decode`` resolved) and ``logits_mb`` (``hardware.logits_mb``)."""
    policy, info = _load_base_policy(cfg, task, tok, device, cache_root, stop, progress)
    policy.decode_impl = decode_impl(cfg, policy, device)
    policy.logits_mb = cfg.hardware.logits_mb
    return policy, info


def _load_base_policy(
    cfg: Config, task: Task, tok, device: torch.device, cache_root: Path, stop=None, progress: bool = False
) -> tuple[torch.nn.Module, dict[str, Any]]:
    if cfg.model.kind == ModelKind.hf_causal_lm:
        from prorl_bench.models.hf_model import fingerprint, load_policy

        targets = list(cfg.adapter.params.targets) if cfg.adapter.kind != AdapterKind.none else []

        def make() -> torch.nn.Module:
            return load_policy(cfg.model, torch.device("cpu"), targets)

        need = task.max_prompt_len + task.max_completion_len
        probe = make()
        if need > probe.max_positions:
            raise ConfigError(
                f"invalid config value model.path={cfg.model.path!r}: its max_position_embeddings "
                f"({probe.max_positions}) < {need} tokens needed by task {task.name}"
            )
        if warmup_enabled(cfg):
            return load_or_train_base(
                cfg, task, tok, device, cache_root, make, fingerprint(cfg.model.path), stop, progress
            )
        return probe.to(device), {"warmup": False, "path": str(cfg.model.path), "impl": type(probe).__name__}
    if warmup_enabled(cfg):
        return load_or_train_base(cfg, task, tok, device, cache_root, stop=stop, progress=progress)
    torch.manual_seed(cfg.warmup.seed)
    return TransformerPolicy(cfg.model, tok.vocab_size).to(device), {"warmup": False}

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

from prorl_bench.base import load_or_train_base
from prorl_bench.config import AdapterKind, Config, ConfigError, ModelKind, PromptStyle
from prorl_bench.model import TransformerPolicy
from prorl_bench.tasks import Task
from prorl_bench.tokenizers import CharTokenizer


def build_tokenizer(cfg: Config):
    """The tokenizer for ``cfg.model`` (CharTokenizer or hf_model.HFTokenizer)."""
    if cfg.model.kind == ModelKind.hf_causal_lm:
        from prorl_bench.hf_model import load_tokenizer

        t = cfg.task
        chat = (t.name == "reasoning_gym" and t.reasoning_gym.prompt_style == PromptStyle.chat) or (
            t.name == "code" and t.code.prompt_style == PromptStyle.chat
        )
        return load_tokenizer(cfg.model.path, chat=chat)
    return CharTokenizer()


def warmup_enabled(cfg: Config) -> bool:
    if cfg.warmup.enabled is not None:
        return cfg.warmup.enabled
    return cfg.model.kind == ModelKind.native


def load_base_policy(
    cfg: Config, task: Task, tok, device: torch.device, cache_root: Path, stop=None, progress: bool = False
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The policy RL starts from, on ``device``, and a description of where it came from.
    ``stop``, ``progress``: see ``base.train_base`` (a warm-up stops early when the run is told to
    stop; it reports its progress)."""
    if cfg.model.kind == ModelKind.hf_causal_lm:
        from prorl_bench.hf_model import fingerprint, load_policy

        targets = list(cfg.adapter.targets) if cfg.adapter.kind != AdapterKind.none else []

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

"""Shared fixtures: tiny local Hugging Face checkpoints (nothing is downloaded)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory):
    """A ~60k-parameter LLaMA + char WordPiece tokenizer *without* a pad token (pads with EOS)."""
    pytest.importorskip("transformers")
    from prorl_bench.tiny_hf import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("hf") / "nopad", hidden_size=32, n_layers=2, n_heads=4,
                            n_kv_heads=2, with_pad=False)


@pytest.fixture(scope="session")
def tiny_hf_dir_pad(tmp_path_factory):
    """As tiny_hf_dir, with a dedicated pad token and full multi-head attention."""
    pytest.importorskip("transformers")
    from prorl_bench.tiny_hf import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("hf") / "pad", hidden_size=32, n_layers=2, n_heads=4,
                            with_pad=True)

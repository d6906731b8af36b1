"""Policies: the native transformer, Hugging Face models, LoRA adapters, tokenizers, sampling and decoding."""

"""Build a tiny LLaMA-architecture causal LM and a character-level WordPiece tokenizer, locally.

Nothing is downloaded: the tokenizer is built from a vocabulary in code with the ``tokenizers``
library, the model from a ``LlamaConfig`` with random weights. Tests and ``benchmarks/`` use it so
that "the same Hugging Face model" means one directory on disk, loaded by every side.

The vocabulary is every printable ASCII character as a word-initial piece plus ``##c`` continuation
pieces, and the pre-tokenizer splits on whitespace only, so ``decode(encode(s)) == s`` for any
single-spaced printable string (``"-4"`` is ``["-", "##4"]``, not ``["-", "4"]``).

Requires the ``hf`` extra (``transformers``, ``tokenizers``).
"""

from __future__ import annotations

from pathlib import Path

SPECIALS = ("[PAD]", "[UNK]", "[BOS]", "[EOS]")

# A minimal chat template in the usual shape (role markers, generation prompt), for tests of
# prompt_style=chat; real instruction-tuned checkpoints ship their own.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def char_wordpiece_tokenizer(with_pad: bool = True):
    """A ``PreTrainedTokenizerFast`` over printable ASCII. ``with_pad=False`` mimics LLaMA-style
    models that ship without a pad token (the bench must then pad with EOS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(33, 127)]
    vocab_list = list(SPECIALS) + chars + [f"##{c}" for c in chars]
    vocab = {t: i for i, t in enumerate(vocab_list)}
    core = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=1000))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    kw = dict(unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]")
    if with_pad:
        kw["pad_token"] = "[PAD]"
    return PreTrainedTokenizerFast(tokenizer_object=core, **kw)


def build_tiny_llama(
    path: str | Path,
    hidden_size: int = 128,
    n_layers: int = 4,
    n_heads: int = 4,
    n_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    with_pad: bool = True,
    seed: int = 0,
    chat_template: bool = False,
) -> Path:
    """Save a randomly initialised ``LlamaForCausalLM`` + tokenizer to ``path``; return the path.

    Defaults give ~0.85M parameters (hidden 128, 4 layers, MLP 344, vocab 192).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = char_wordpiece_tokenizer(with_pad=with_pad)
    if chat_template:
        tok.chat_template = CHAT_TEMPLATE
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or int(hidden_size * 8 / 3 + 7) // 8 * 8,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads or n_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


FAMILIES = ("llama", "qwen2", "qwen3", "gemma", "phi3", "gpt_neox", "gpt2")


def build_tiny(family: str, path: str | Path, hidden_size: int = 32, n_layers: int = 2, n_heads: int = 4,
               max_position_embeddings: int = 256, seed: int = 0) -> Path:  # fmt: skip
    """A tiny random checkpoint of another architecture transformers ships (offline), with the same
    character tokenizer: one of ``FAMILIES``."""
    import torch
    import transformers as tf

    if family == "llama":
        return build_tiny_llama(path, hidden_size, n_layers, n_heads, max_position_embeddings=max_position_embeddings,
                                seed=seed)  # fmt: skip
    tok = char_wordpiece_tokenizer(with_pad=True)
    ids = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
               eos_token_id=tok.eos_token_id, tie_word_embeddings=False)  # fmt: skip
    if family == "qwen2":
        cfg = tf.Qwen2Config(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=n_layers,
                             num_attention_heads=n_heads, num_key_value_heads=n_heads // 2,
                             max_position_embeddings=max_position_embeddings, **ids)  # fmt: skip
        model = tf.Qwen2ForCausalLM
    elif family == "gpt_neox":
        cfg = tf.GPTNeoXConfig(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=n_layers,
                               num_attention_heads=n_heads, max_position_embeddings=max_position_embeddings,
                               use_parallel_residual=True, **ids)  # fmt: skip
        model = tf.GPTNeoXForCausalLM
    elif family == "qwen3":  # per-head q/k RMSNorm
        cfg = tf.Qwen3Config(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=n_layers,
                             num_attention_heads=n_heads, num_key_value_heads=n_heads // 2,
                             head_dim=hidden_size // n_heads, max_position_embeddings=max_position_embeddings,
                             **ids)  # fmt: skip
        model = tf.Qwen3ForCausalLM
    elif family == "gemma":  # embeddings scaled by sqrt(hidden), GeGLU MLP, (1 + w) RMSNorm
        cfg = tf.GemmaConfig(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=n_layers,
                             num_attention_heads=n_heads, num_key_value_heads=1, head_dim=hidden_size // n_heads,
                             max_position_embeddings=max_position_embeddings, **ids)  # fmt: skip
        model = tf.GemmaForCausalLM
    elif family == "phi3":  # fused qkv_proj and gate_up_proj
        cfg = tf.Phi3Config(hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=n_layers,
                            num_attention_heads=n_heads, num_key_value_heads=n_heads,
                            max_position_embeddings=max_position_embeddings, **ids)  # fmt: skip
        model = tf.Phi3ForCausalLM
    elif family == "gpt2":
        cfg = tf.GPT2Config(n_embd=hidden_size, n_layer=n_layers, n_head=n_heads,
                            n_positions=max_position_embeddings, **ids)  # fmt: skip
        model = tf.GPT2LMHeadModel
    else:
        raise ValueError(f"unknown family {family!r}: allowed {FAMILIES}")
    torch.manual_seed(seed)
    m = model(cfg)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    m.save_pretrained(path)
    tok.save_pretrained(path)
    return path


# Positions the CLI gives a model: 256 fit the built-in tasks; chat prompts (task=gsm: up to 600 question
# characters + instruction + template allowance, one token per character here, + 256 completion tokens
# = 1007; task=code: 546; task=math_jsonl on the shipped example: 519) need 1024.
POSITIONS = 256
CHAT_POSITIONS = 1024


def main(argv: list[str] | None = None) -> Path:
    """``python -m prorl_bench.models.tiny_hf OUT_DIR [--chat-template] [--max-positions N]``: build and print
    the directory."""
    import argparse

    ap = argparse.ArgumentParser(description="Save a tiny random LLaMA + char tokenizer (offline) to OUT_DIR.")
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--no-pad", action="store_true", help="ship no pad token (the bench then pads with EOS)")
    ap.add_argument("--chat-template", action="store_true",
                    help=f"give the tokenizer a minimal chat template (and {CHAT_POSITIONS} positions)")  # fmt: skip
    ap.add_argument("--max-positions", type=int, default=None,
                    help=f"context length in tokens (default {POSITIONS}; {CHAT_POSITIONS} with --chat-template, "
                         "enough for task=gsm, task=code and task=math_jsonl)")  # fmt: skip
    args = ap.parse_args(argv)
    positions = args.max_positions or (CHAT_POSITIONS if args.chat_template else POSITIONS)
    if positions < 8:
        ap.error(f"--max-positions {positions}: allowed >= 8")
    out = build_tiny_llama(
        args.out,
        hidden_size=args.hidden,
        n_layers=args.layers,
        max_position_embeddings=positions,
        with_pad=not args.no_pad,
        chat_template=args.chat_template,
    )
    print(out)
    return out


if __name__ == "__main__":
    main()

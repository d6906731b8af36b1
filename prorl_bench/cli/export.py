"""``prorl-bench-export RUN_DIR OUT`` and ``prorl-bench-sample RUN_DIR_OR_EXPORT --prompt TEXT``: the
command-line tools around ``run/export.py`` (the formats are documented there).

``prorl-bench-sample RUN_DIR_OR_EXPORT --prompt TEXT [--n 4] [--temperature 1.0]`` samples
completions from a run's (or an exported directory's) policy with the bench's own sampler.

Routed runs (``adapter=dual_lora``): both tools take ``--mode retain|forget|both`` or ``--scales R,F``
(the retain and forget adapters' scales). Sampling defaults to both at 1; export requires a choice
and folds the scaled adapters into the weights (``dual_lora.fold_dual``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from prorl_bench.config import ConfigError, ModelConfig, ModelKind
from prorl_bench.run.export import NATIVE_FORMAT, export_run, load_native, load_run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="prorl-bench-export", description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", help="a run directory with checkpoints/step_*.pt")
    ap.add_argument("out", help="output directory")
    ap.add_argument("--merged", action="store_true", help="merge LoRA adapters into the weights (always done now)")
    _add_scale_args(ap, "export a routed (adapter=dual_lora) run with these adapter scales (required for one)")
    args = ap.parse_args(argv)
    try:
        print(export_run(args.run_dir, args.out, _scales_arg(args)))
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def load_any(path: str | Path) -> tuple[nn.Module, Any]:
    """(policy, tokenizer) from a run directory, a native export or an HF export/checkpoint dir."""
    p = Path(path)
    if (p / "checkpoints").is_dir():
        policy, tok, _, _ = load_run(p)
        return policy, tok
    cfg_file = p / "config.json"
    if cfg_file.is_file() and json.loads(cfg_file.read_text()).get("format") == NATIVE_FORMAT:
        return load_native(p)
    if cfg_file.is_file():
        from prorl_bench.models.hf_model import load_policy, load_tokenizer

        model = ModelConfig(kind=ModelKind.hf_causal_lm, path=str(p))
        return load_policy(model, torch.device("cpu")).eval(), load_tokenizer(p)
    raise ConfigError(f"{p}: neither a run directory (checkpoints/) nor an exported model (config.json)")


@torch.no_grad()
def sample(
    policy: nn.Module, tok: Any, prompt: str, n: int, temperature: float, max_new_tokens: int, seed: int = 0
) -> list[str]:
    """``n`` completions of ``prompt`` (decoded, cut at EOS) with the bench's sampler;
    ``temperature`` 0 means greedy. ``max_new_tokens`` is capped by the model's context."""
    from prorl_bench.models.rollout import generate

    ids, mask = tok.encode_prompts([prompt] * n)
    limit = int(getattr(policy, "max_positions", 0) or getattr(getattr(policy, "cfg", None), "max_seq_len", 0))
    if limit:
        max_new_tokens = min(max_new_tokens, limit - ids.shape[1])
    if max_new_tokens < 1:
        raise ConfigError(f"prompt of {ids.shape[1]} tokens leaves no room in the model's {limit}-token context")
    gen = torch.Generator().manual_seed(seed)
    greedy = temperature <= 0
    r = generate(policy, tok, ids, mask, max_new_tokens, 1.0 if greedy else temperature, generator=gen, greedy=greedy)
    return [tok.decode(row[r.prompt_len :].tolist()) for row in r.ids]


def sample_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="prorl-bench-sample", description="Sample from a run's or an export's policy.")
    ap.add_argument("path", help="a run directory (newest checkpoint) or an exported model directory")
    ap.add_argument("--prompt", action="append", required=True, help="prompt text (repeatable)")
    ap.add_argument("--n", type=int, default=4, help="completions per prompt")
    ap.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    _add_scale_args(ap, "a routed (adapter=dual_lora) run's adapter scales (default: both at 1)")
    args = ap.parse_args(argv)
    try:
        policy, tok = load_any(args.path)
        policy = _scaled_for_sampling(policy, _scales_arg(args))
        for prompt in args.prompt:
            texts = sample(policy, tok, prompt, args.n, args.temperature, args.max_new_tokens, args.seed)
            for i, text in enumerate(texts):
                print(json.dumps({"prompt": prompt, "i": i, "completion": text}))
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _add_scale_args(ap: argparse.ArgumentParser, what: str) -> None:
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--mode", choices=["retain", "forget", "both"], help=f"{what}: retain = forget adapter at 0")
    g.add_argument("--scales", metavar="R,F", help=f"{what}: retain scale R and forget scale F, e.g. 1,0.5")


def _scales_arg(args: argparse.Namespace) -> tuple[float, float] | None:
    from prorl_bench.models.dual_lora import parse_scales, resolve_scales

    if args.mode is not None:
        return resolve_scales(args.mode)
    return parse_scales(args.scales) if args.scales is not None else None


def _scaled_for_sampling(policy: nn.Module, scales: tuple[float, float] | None) -> nn.Module:
    """Set a routed policy's adapter scales for sampling; refuse scales on a policy without dual adapters."""
    from prorl_bench.models.dual_lora import dual_layers

    layers = dual_layers(policy)
    if scales is not None and not layers:
        raise ConfigError("--mode/--scales need a routed run (adapter=dual_lora); this policy has no dual adapters")
    for m in layers:
        m.scales = scales if scales is not None else (1.0, 1.0)
    return policy


if __name__ == "__main__":
    sys.exit(main())

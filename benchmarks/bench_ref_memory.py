"""Peak memory of the reference model: a deep copy vs the adapter reference (LoRA, frozen base).

    python benchmarks/bench_ref_memory.py                       # CPU: peak RSS, ~110M-parameter LLaMA
    python benchmarks/bench_ref_memory.py --device cuda --hidden 1024 --layers 16

Builds one random LLaMA checkpoint locally (nothing is downloaded), then runs a short A1 run with
``adapter=lora`` once per reference kind, each in a fresh process (so one run's peak cannot hide
another's), and prints peak RSS (CPU) or ``torch.cuda.max_memory_allocated`` (GPU) per kind.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

KINDS = ("copy", "adapters")


def one(args) -> None:
    import torch
    from hydra import compose, initialize_config_dir

    from prorl_bench.cli.app import CONF_DIR
    from prorl_bench.config import to_config
    from prorl_bench.run.trainer import train

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                "model=hf_causal_lm",
                f"model.path={args.model}",
                "model.impl=hf",
                f"hardware.device={args.device}",
                "adapter=lora",
                "adapter.targets=[q_proj,v_proj]",
                f"adapter.reference={args.side}",
                "variant=A1",
                f"steps={args.steps}",
                "eval_every=1000",
                "algo.prompts_per_step=2",
                "algo.group_size=4",
                "task.val_size=4",
                "progress=false",
                "checkpoint.every=0",
            ],
        )
    with tempfile.TemporaryDirectory() as d:
        train(to_config(cfg), Path(d) / "run", Path(d) / "cache", threads=args.threads)
    out = {"side": args.side, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if args.device == "cuda":
        out["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--side", choices=KINDS)
    ap.add_argument("--model")
    args = ap.parse_args()
    if args.side:
        return one(args)
    from prorl_bench.models.tiny_hf import build_tiny_llama

    with tempfile.TemporaryDirectory() as d:
        heads = max(1, args.hidden // 64)
        model = build_tiny_llama(Path(d) / "m", hidden_size=args.hidden, n_layers=args.layers, n_heads=heads)
        size_mb = sum(f.stat().st_size for f in model.glob("*.safetensors")) / 2**20
        print(f"model: hidden {args.hidden}, {args.layers} layers, weights {size_mb:.0f} MB on disk")
        rows = []
        for side in KINDS:
            cmd = [sys.executable, __file__, "--side", side, "--model", str(model), "--device", args.device]
            cmd += ["--steps", str(args.steps), "--threads", str(args.threads)]
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                sys.exit(f"{side} failed:\n{r.stderr[-3000:]}")
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        key = "cuda_max_allocated_mb" if args.device == "cuda" else "peak_rss_mb"
        for row in rows:
            print(f"{row['side']:>9}: {key} = {row[key]:.0f}")
        print(f"saved by the adapter reference: {rows[0][key] - rows[1][key]:.0f} MB (weights {size_mb:.0f} MB)")


if __name__ == "__main__":
    main()

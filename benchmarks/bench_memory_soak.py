"""Memory soak: does a long run's resident memory stay flat? (issue 48)

    python benchmarks/bench_memory_soak.py                       # every configuration, 600 steps each
    python benchmarks/bench_memory_soak.py --steps 2000 --only A1 # one configuration, a 2,000-step run
    python benchmarks/bench_memory_soak.py --steps 300 --only trl code --out /tmp/soak

Each configuration runs through the installed ``prorl-bench`` entry point (one torch thread, a shared
warm-up cache built by the first run), one after the other, and its resident memory is read from the run's
own metrics rows: ``mem/rss_mb``, the process's RSS after every RL step (``prorl_bench/run/memory.py``).
A population writes one run directory per member; their rows carry the one process's RSS.

Printed per configuration: the least-squares slope of RSS against step after step ``--warm`` (MB per 100
steps; goal < 1), RSS at step ``--warm``, the peak after it, peak / step-``--warm`` (goal ≤ 1.10), the run's
ms per step and wall seconds. The table is Markdown (docs/performance.md holds the measured one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prorl_bench.run.memory import RSS_KEY, ols_slope

BIN = Path(sys.executable).parent
COMMON = ["progress=false", "hardware.torch_threads=1", "eval.n_samples=4", "eval.ks=[1,4]", "task.val_size=32"]

# name -> (entry point, extra overrides). Evaluations every 100 steps so their buffers are part of the soak.
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "A0": ("prorl-bench", ["variant=A0"]),
    "A1": ("prorl-bench", ["variant=A1"]),
    "B": ("prorl-bench", ["variant=B"]),
    "C": ("prorl-bench", ["variant=C", "reset=periodic", "reset.every=50", "opt_reset=hard"]),
    "lora_growth": ("prorl-bench", ["adapter=lora", "growth=rank", "growth.grow_every=50", "growth.max_rank=16"]),
    "trl": (
        "prorl-bench",
        ["engine=trl", "variant=C", "reset=periodic", "reset.every=50", "model=hf_causal_lm", "model.path={hf}"],
    ),  # fmt: skip
    "population": (
        "prorl-bench",
        ["-m", "seed=0,1", "hydra/launcher=population", "hydra.launcher.n_jobs=1", "hydra.callbacks={}"],
    ),  # fmt: skip
    "code": (
        "prorl-bench",
        [
            "task=code",
            "model=hf_causal_lm",
            "model.path={hf_code}",
            "task.prompt_style=question",
            "task.max_completion_tokens=32",
            "task.workers=4",
            "eval.n_sample_prompts=2",
            "algo.prompts_per_step=2",
            "algo.group_size=4",
        ],
    ),  # fmt: skip
}


def soak(name: str, steps: int, warm: int, out: Path, cache: Path, eval_every: int) -> dict:
    exe, extra = CONFIGS[name]
    if any("{hf" in x for x in extra):  # a tiny random LLaMA, built locally once (offline)
        from prorl_bench.models.tiny_hf import build_tiny_llama

        hf = {"hf": out / "tiny_hf", "hf_code": out / "tiny_hf_code"}
        if not hf["hf"].exists():
            build_tiny_llama(hf["hf"], hidden_size=32, n_layers=2, n_heads=4)
            build_tiny_llama(hf["hf_code"], hidden_size=32, n_layers=2, n_heads=4, max_position_embeddings=512)
        extra = [x.format(**hf) for x in extra]
    run_dir = out / name
    multirun = "-m" in extra
    where = [f"hydra.sweep.dir={run_dir}"] if multirun else [f"run_dir={run_dir}"]
    cmd = [str(BIN / exe), *extra, f"steps={steps}", f"eval_every={eval_every}", f"warmup.cache_dir={cache}",
           *COMMON, *where]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"name": name, "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:], "cmd": cmd}
    metrics = sorted(run_dir.rglob("metrics.jsonl"))
    rows = [json.loads(line) for line in metrics[0].read_text().splitlines()]
    pts = [(r["step"], r[RSS_KEY]) for r in rows if r["step"] >= warm and r.get(RSS_KEY)]
    slope = ols_slope([float(s) for s, _ in pts], [v for _, v in pts]) * 100
    at_warm, peak = pts[0][1], max(v for _, v in pts)
    ms = 1000 * sum(r["time/step"] for r in rows) / len(rows)
    return {"name": name, "steps": len(rows), "slope": slope, "at_warm": at_warm, "peak": peak,
            "ratio": peak / at_warm, "ms_per_step": ms, "wall_s": wall, "cmd": cmd}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--warm", type=int, default=200, help="the slope is fitted from this step on")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--only", nargs="*", choices=sorted(CONFIGS), default=None)
    ap.add_argument("--out", type=Path, default=None, help="run directories (default: a temporary directory)")
    a = ap.parse_args()
    if a.steps <= a.warm + 10:
        ap.error(f"--steps {a.steps} leaves no window after --warm {a.warm}")
    out = a.out or Path(tempfile.mkdtemp(prefix="soak-"))
    cache = out / "base_cache"
    print(f"run directories under {out}", flush=True)
    print(f"| configuration | steps | RSS at step {a.warm} (MB) | peak after (MB) | peak / step {a.warm} "
          f"| slope after step {a.warm} (MB / 100 steps) | ms/step | wall (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|", flush=True)
    failed = False
    for name in a.only or list(CONFIGS):
        r = soak(name, a.steps, a.warm, out, cache, a.eval_every)
        if "error" in r:
            failed = True
            print(f"| {name} | failed: {r['error']} | | | | | | |", flush=True)
            continue
        print(f"| {name} | {r['steps']} | {r['at_warm']:.0f} | {r['peak']:.0f} | {r['ratio']:.3f} | {r['slope']:+.2f} "
              f"| {r['ms_per_step']:.0f} | {r['wall_s']:.0f} |", flush=True)  # fmt: skip
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

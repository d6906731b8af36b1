"""Seed populations vs separate processes: runs x steps per second, MFU, where the time goes, memory.

    python benchmarks/bench_population.py                      # S in 1 2 4 8 16 32, default size and model=small
    python benchmarks/bench_population.py --sizes 1 4 16 --steps 10 --models tiny
    python benchmarks/bench_population.py --designs            # the M1 design micro-benchmark only
    python benchmarks/bench_population.py --in-process --sizes 4 8 --steps 10   # one core, no launcher

For each S, interleaved in one invocation: the same multirun of S seeds (``prorl-bench -m seed=0..S-1``)
through the joblib launcher (2 workers, one torch thread each: S separate runs) and through
``hydra/launcher=population`` (2 worker processes, populations of ceil(S/2) members, one thread each),
both with the same warm-up cache (built once first, not timed). Reported: wall seconds of the whole
command (process start-up, base loading, validation included), runs*steps/s, the ratio, MFU (the runs'
counted FLOPs / wall / (2 x the measured 1-thread fp32 matmul peak)), the share of each stage in the
runs' summed stage times, and peak RSS per member (``mem/peak_rss_mb`` of each worker process divided
by the members it held at once).

``--in-process`` compares, in this one process on one thread, S single runs one after the other
(``trainer.train``) with one population of S (``run_population``), alternating, without validation:
wall seconds and the runs' summed stage times — the launchers' process start-up and scheduling out
of the picture.

``--designs`` times the two batching designs the issue names against a loop over members, on the
default model with 1 thread: (a) ``torch.func.stack_module_state`` + ``functional_call`` + ``vmap``,
(b) ``StackedPolicy`` (batched matmuls over stacked weights), for the teacher-forced forward+backward
of B=64 rows x T=16 and for 7 KV-cached sampling steps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = ("rollout", "reward", "old_logprob", "ref_logprob", "update", "reset", "eval")


def _run(args: list[str], sweep: Path, cache: Path) -> float:
    # the installed entry point, as a user starts it (no PYTHONPATH: the launcher must come from the install)
    cmd = [str(Path(sys.executable).with_name("prorl-bench")), "-m", *args, f"warmup.cache_dir={cache}",
           f"hydra.sweep.dir={sweep}", "hydra.callbacks={}", "progress=false"]  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=sweep.parent)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    return wall


def _collect(sweep: Path, per_process: int) -> dict[str, float]:
    """Summed FLOPs and stage times over every run's metrics; peak RSS per member."""
    flops, stages, rss = 0.0, dict.fromkeys(STAGES, 0.0), []
    for m in sweep.rglob("metrics.jsonl"):
        for line in m.read_text().splitlines():
            row = json.loads(line)
            flops += row["perf/flops"]
            for s in STAGES:
                stages[s] += row[f"time/{s}"]
        summary = json.loads((m.parent / "summary.json").read_text())
        rss.append(summary["mem/peak_rss_mb"])
    total = sum(stages.values()) or 1.0
    return {"flops": flops, "rss_per_member_mb": max(rss) / per_process,
            **{f"share/{s}": v / total for s, v in stages.items()}}  # fmt: skip


def throughput(
    sizes: list[int],
    models: list[str],
    steps: int,
    extra: list[str],
    repeats: int = 1,
    population_args: tuple[str, ...] = (),
) -> None:
    import torch

    from prorl_bench.run.accounting import measured_matmul_peak

    torch.set_num_threads(1)
    peak = measured_matmul_peak(torch.device("cpu"), torch.float32)
    print(
        f"1-thread fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s; 2 workers; steps={steps}; os.cpu_count={os.cpu_count()}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-pop-") as tmp:
        tmp = Path(tmp)
        cache = tmp / "cache"
        for model in models:
            base = [f"model={model}", f"steps={steps}", *extra]
            _run([*base, "seed=0", "steps=1"], tmp / f"warm-{model}", cache)  # build the warm-up base once
            print(f"\n## model={model}\n")
            print("| S | joblib s (median) | population s (median) | joblib runs·steps/s | population runs·steps/s | "
                  "ratio (per repeat) | "
                  "MFU joblib | MFU pop | RSS/member MB joblib | pop | pop stage shares |")  # fmt: skip
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            for s in sizes:
                seeds = "seed=" + ",".join(str(i) for i in range(s))
                size = max(1, math.ceil(s / 2))
                walls: dict[str, list[float]] = {"joblib": [], "population": []}
                res = {}
                for rep in range(repeats):  # interleaved, the order alternating: both arms see the same load
                    for kind in ("joblib", "population") if (s + rep) % 2 else ("population", "joblib"):
                        sweep = tmp / f"{model}-{kind}-{s}-{rep}"
                        launcher = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
                        if kind == "population":
                            launcher = [
                                "hydra/launcher=population",
                                "hydra.launcher.n_jobs=2",
                                f"hydra.launcher.size={size}",
                                *population_args,
                            ]
                        walls[kind].append(_run([*base, seeds, *launcher], sweep, cache))
                        res[kind] = _collect(sweep, size if kind == "population" and s > 1 else 1)
                    print(f"S={s} repeat {rep + 1}: joblib {walls['joblib'][-1]:.1f} s, "
                          f"population {walls['population'][-1]:.1f} s", file=sys.stderr, flush=True)  # fmt: skip
                wj, wp = statistics.median(walls["joblib"]), statistics.median(walls["population"])
                cj, cp = res["joblib"], res["population"]
                rj, rp = s * steps / wj, s * steps / wp
                shares = " ".join(f"{k[6:]} {v:.0%}" for k, v in cp.items() if k.startswith("share/") and v >= 0.01)
                mfu_j, mfu_p = cj["flops"] / wj / (2 * peak), cp["flops"] / wp / (2 * peak)
                ratios = "/".join(f"{j / p:.2f}" for j, p in zip(walls["joblib"], walls["population"]))
                cells = [
                    f"{wj:.1f}",
                    f"{wp:.1f}",
                    f"{rj:.2f}",
                    f"{rp:.2f}",
                    f"{rp / rj:.2f}× ({ratios})",
                    f"{mfu_j:.1%}",
                    f"{mfu_p:.1%}",
                    f"{cj['rss_per_member_mb']:.0f}",
                    f"{cp['rss_per_member_mb']:.0f}",
                    shares,
                ]
                print(f"| {s} | " + " | ".join(cells) + " |", flush=True)


def in_process(sizes: list[int], steps: int, extra: list[str], model: str) -> None:
    import torch
    from hydra import compose, initialize_config_dir

    from prorl_bench.config import register_configs, to_config
    from prorl_bench.population.runner import MemberJob, run_population
    from prorl_bench.run.trainer import train
    from prorl_bench.searchpath import CONF_DIR

    torch.set_num_threads(1)
    register_configs()
    over = [f"model={model}", f"steps={steps}", "eval_every=100000", "eval.at_start=false", "progress=false", *extra]

    def cfg(seed: int):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return to_config(compose(config_name="config", overrides=[*over, f"seed={seed}"]))

    def sums(dirs: list[Path]) -> dict[str, float]:
        out = dict.fromkeys(("step", "rollout", "update"), 0.0)
        for d in dirs:
            for line in (d / "metrics.jsonl").read_text().splitlines():
                row = json.loads(line)
                for k in out:
                    out[k] += row[f"time/{k}"]
        return out

    print("| S | singles wall s | population wall s | ratio | singles Σrollout s | pop Σrollout s | "
          "singles Σupdate s | pop Σupdate s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench-pop-inproc-") as tmp:
        tmp, cache = Path(tmp), Path(tmp) / "cache"
        train(cfg(0), tmp / "warm", cache)  # the warm-up base, built once, not timed
        for s in sizes:
            t0 = time.perf_counter()
            singles = [tmp / f"single-{s}-{i}" for i in range(s)]
            for i, d in enumerate(singles):
                train(cfg(i), d, cache)
            w_single = time.perf_counter() - t0
            t0 = time.perf_counter()
            jobs = [MemberJob(cfg(i), tmp / f"pop-{s}-{i}") for i in range(s)]
            run_population(jobs, cache)
            w_pop = time.perf_counter() - t0
            a, b = sums(singles), sums([j.run_dir for j in jobs])
            cells = [f"{w_single:.1f}", f"{w_pop:.1f}", f"{w_single / w_pop:.2f}×", f"{a['rollout']:.1f}",
                     f"{b['rollout']:.1f}", f"{a['update']:.1f}", f"{b['update']:.1f}"]  # fmt: skip
            print(f"| {s} | " + " | ".join(cells) + " |", flush=True)


def designs(sizes: list[int]) -> None:
    import torch

    torch.set_num_threads(1)
    print("| S | fwd+bwd loop ms | stacked ms | vmap ms | sampling loop ms | stacked ms |")
    print("|---|---|---|---|---|---|")
    for s in sizes:
        print(_design_row(s), flush=True)


def _timed(fn, n: int = 3) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e3


def _design_row(s: int, b: int = 64, t: int = 16, p: int = 7, n_new: int = 7) -> str:
    """One table row: S members, B rows of T tokens (fwd+bwd); P prompt tokens + n_new sampled."""
    import copy

    import torch
    from torch.func import functional_call, stack_module_state, vmap

    from prorl_bench.config import ModelConfig
    from prorl_bench.models.model import TransformerPolicy, positions
    from prorl_bench.population.model import StackedPolicy

    members = []
    for i in range(s):
        torch.manual_seed(i)
        members.append(TransformerPolicy(ModelConfig(), 16))
    stacked = StackedPolicy(members)
    params, bufs = stack_module_state([copy.deepcopy(m) for m in members])
    skeleton = copy.deepcopy(members[0]).to("meta")
    ids = torch.randint(0, 16, (s, b, t))
    mask = torch.ones(s, b, t, dtype=torch.bool)
    cpu = torch.device("cpu")

    def loop():
        for i, m in enumerate(members):
            m(ids[i], mask[i]).square().mean().backward()

    def batched():
        stacked(ids, mask).square().mean().backward()

    def vmapped():
        f = vmap(lambda pr, bf, x, k: functional_call(skeleton, (pr, bf), (x, k)))
        f(params, bufs, ids, mask).square().mean().backward()

    @torch.no_grad()
    def sample_loop():
        for i, m in enumerate(members):
            c = m.new_cache(b, p + n_new, cpu)
            logits = m.forward_cached(ids[i, :, :p], mask[i, :, :p], positions(mask[i, :, :p]), c)[:, -1]
            nxt_pos = torch.full((b, 1), p)
            for _ in range(n_new):
                tok = torch.multinomial(torch.softmax(logits, -1), 1)
                logits = m.forward_cached(tok, mask[i, :, :1], nxt_pos, c)[:, -1]
                nxt_pos = nxt_pos + 1

    @torch.no_grad()
    def sample_stacked():
        c = stacked.new_cache(b, p + n_new, cpu)
        logits = stacked.forward_cached(ids[:, :, :p], mask[:, :, :p], positions(mask[:, :, :p]), c)[:, :, -1]
        nxt_pos = torch.full((s, b, 1), p)
        for _ in range(n_new):
            tok = torch.multinomial(torch.softmax(logits, -1).view(s * b, -1), 1).view(s, b, 1)
            logits = stacked.forward_cached(tok, mask[:, :, :1], nxt_pos, c)[:, :, -1]
            nxt_pos = nxt_pos + 1

    cells = [_timed(f) for f in (loop, batched, vmapped, sample_loop, sample_stacked)]
    return f"| {s} | " + " | ".join(f"{c:.0f}" for c in cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--models", nargs="+", default=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--designs", action="store_true", help="only the design micro-benchmark")
    ap.add_argument("--in-process", action="store_true", help="singles vs a population in this process")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved repetitions per S (medians reported)")
    ap.add_argument("--population-arg", action="append", default=[], help="extra override for the population arm")
    ap.add_argument("extra", nargs="*", help="more overrides for every run (e.g. algo.group_size=4)")
    a = ap.parse_args()
    if a.designs:
        designs([s for s in a.sizes if s in (1, 8, 32)] or a.sizes)
        return
    if a.in_process:
        for model in a.models:
            print(f"\n## model={model}\n")
            in_process(a.sizes, a.steps, a.extra, model)
        return
    throughput(a.sizes, a.models, a.steps, a.extra, a.repeats, tuple(a.population_arg))


if __name__ == "__main__":
    main()

"""What gradient routing costs: ms per update step with the dual adapters, routed vs not routed.

    PYTHONPATH=. python benchmarks/bench_routing.py [--steps 20] [--repeats 3]

Runs task=hack_reverse with adapter=dual_lora twice per repeat, interleaved: detector=none (the
same adapters, nothing routed) and detector=reward_field (every labelled row takes the detached
retain path). Reports the median over repeats of the mean time/update and time/step (ms).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from prorl_bench.config import register_configs, to_config
from prorl_bench.searchpath import CONF_DIR
from prorl_bench.trainer import train


def _run(detector: str, steps: int, root: Path, i: int) -> tuple[float, float]:
    overrides = ["task=hack_reverse", "adapter=dual_lora", f"detector={detector}", f"steps={steps}",
                 f"eval_every={steps}", "eval.at_start=false", f"warmup.cache_dir={root / 'cache'}"]  # fmt: skip
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=overrides))
    s = train(cfg, root / f"{detector}-{i}", root / "cache", threads=1)
    t = s["totals"]
    return 1e3 * t["time/update"] / steps, 1e3 * t["time/step"] / steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    register_configs()
    res: dict[str, list[tuple[float, float]]] = {"none": [], "reward_field": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for det in res:
                res[det].append(_run(det, args.steps, Path(tmp), i))
    for det, rows in res.items():
        upd = statistics.median(r[0] for r in rows)
        step = statistics.median(r[1] for r in rows)
        print(f"detector={det:13s} update {upd:7.1f} ms/step   whole step {step:7.1f} ms/step")
    ratio = statistics.median(r[0] for r in res["reward_field"]) / statistics.median(r[0] for r in res["none"])
    print(f"routing / no routing, update time: {ratio:.3f}x")


if __name__ == "__main__":
    main()

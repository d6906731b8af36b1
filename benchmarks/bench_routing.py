"""What gradient routing costs: ms per update step with the dual adapters, routed vs not routed,
and with split advantages (a second backward pass).

    PYTHONPATH=. python benchmarks/bench_routing.py [--steps 20] [--repeats 3] [--split]

Runs task=hack_reverse with adapter=dual_lora per repeat, interleaved: detector=none (the same
adapters, nothing routed), detector=reward_field (every labelled row takes the detached retain
path) and, with ``--split``, reward_field with route.advantages=split (retain and forget adapters
from two backward passes over one forward). Reports the median over repeats of the mean
time/update and time/step (ms).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from prorl_bench.config import register_configs, to_config
from prorl_bench.run.trainer import train
from prorl_bench.searchpath import CONF_DIR

ARMS = {"none": ["detector=none"], "reward_field": ["detector=reward_field"],
        "split": ["detector=reward_field", "route.advantages=split"]}  # fmt: skip


def _run(arm: str, steps: int, root: Path, i: int) -> tuple[float, float]:
    overrides = ["task=hack_reverse", "adapter=dual_lora", *ARMS[arm], f"steps={steps}",
                 f"eval_every={steps}", "eval.at_start=false", f"warmup.cache_dir={root / 'cache'}"]  # fmt: skip
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=overrides))
    s = train(cfg, root / f"{arm}-{i}", root / "cache", threads=1)
    t = s["totals"]
    return 1e3 * t["time/update"] / steps, 1e3 * t["time/step"] / steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--split", action="store_true", help="also time route.advantages=split")
    args = p.parse_args()
    register_configs()
    res: dict[str, list[tuple[float, float]]] = {
        "none": [],
        "reward_field": [],
        **({"split": []} if args.split else {}),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for det in res:
                res[det].append(_run(det, args.steps, Path(tmp), i))
    for det, rows in res.items():
        upd = statistics.median(r[0] for r in rows)
        step = statistics.median(r[1] for r in rows)
        print(f"{det:13s} update {upd:7.1f} ms/step   whole step {step:7.1f} ms/step")
    none = statistics.median(r[0] for r in res["none"])
    for arm in [a for a in res if a != "none"]:
        ratio = statistics.median(r[0] for r in res[arm]) / none
        print(f"{arm} / no routing, update time: {ratio:.3f}x")


if __name__ == "__main__":
    main()

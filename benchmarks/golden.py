"""Golden trajectories: run a fixed set of configurations for a few steps and dump every logged value
that does not measure wall-clock time, so two versions of the code can be compared bit for bit.

    # dump this checkout's trajectories, then main's, then compare
    PYTHONPATH=. python benchmarks/golden.py run /tmp/golden_branch.json
    PYTHONPATH=/work/main python benchmarks/golden.py run /tmp/golden_main.json
    python benchmarks/golden.py compare /tmp/golden_main.json /tmp/golden_branch.json

What is compared: every metrics row (``metrics.jsonl``) minus timers and throughput figures, every
validation row, and every event's fields minus wall-clock ones. Floats are compared exactly (their
``repr``); NaN equals NaN. ``compare`` prints the number of values compared and every difference,
and exits 1 if there is one. The configurations cover the variants (A0, A1, B), resets (hard and
soft optimizer transforms, a polyak mix with the KL folded into the reward through k2's
``ref_over_old`` form), LoRA with rank growth, gradient routing (dual LoRA) and Dr. GRPO's
``seq_mean_token_sum_norm`` aggregation. Runs share one warm-up cache (``--cache``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

SMALL = [
    "steps=12",
    "eval_every=4",
    "algo.prompts_per_step=4",
    "algo.group_size=4",
    "warmup.target_success=0.05",
    "task.val_size=16",
    "eval.n_samples=4",
    "eval.ks=[1,2,4]",
    "eval.n_sample_prompts=2",
    "progress=false",
]

CONFIGS: dict[str, list[str]] = {
    "A0": ["variant=A0"],
    "A1": ["variant=A1"],
    "B": ["variant=B"],
    "C_hard": ["variant=C", "reset=periodic", "reset.every=4", "opt_reset=hard"],
    "C_soft_periodic": ["variant=C", "reset=periodic", "reset.every=3", "opt_reset=soft"],
    "C_polyak_k2_reward": [
        "variant=C",
        "reset=polyak",
        "reset.every=5",
        "kl_estimator=k2",
        "kl_estimator.placement=reward",
        "kl_estimator.k2_mode=ref_over_old",
    ],
    "lora_growth": [
        "variant=C",
        "reset=periodic",
        "reset.every=6",
        "adapter=lora",
        "growth=rank",
        "growth.grow_every=4",
        "growth.max_rank=8",
    ],
    "dual_lora_routing": ["task=hack_reverse", "adapter=dual_lora", "detector=hack_pattern"],
    "dr_grpo": ["algo=dr_grpo"],
}

WALL_CLOCK = ("time/", "throughput/", "perf/flops_per_s", "perf/mfu", "wall_time_s", "mem/")


def _timeless(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.startswith(WALL_CLOCK)}


def run_all(out: Path, cache: Path, names: list[str]) -> None:
    from hydra import compose, initialize_config_dir

    from prorl_bench.config import register_configs, to_config

    try:  # the subpackage layout; checkouts before it had every module at the top of prorl_bench/
        from prorl_bench.cli.app import CONF_DIR
        from prorl_bench.run.outputs import read_jsonl
        from prorl_bench.run.trainer import train
    except ImportError:
        from prorl_bench.app import CONF_DIR
        from prorl_bench.outputs import read_jsonl
        from prorl_bench.trainer import train

    register_configs()
    dump: dict[str, Any] = {}
    # The trajectories are those of the regime every earlier checkout ran by default: checkouts with
    # conf/regime (whose default became v2) are pinned to v1_trap, so old and new stay comparable.
    regime = ["regime=v1_trap"] if (Path(CONF_DIR) / "regime" / "v1_trap.yaml").is_file() else []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
                cfg = to_config(compose(config_name="config", overrides=SMALL + regime + CONFIGS[name]))
            run_dir = Path(tmp) / name
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                train(cfg, run_dir, cache, threads=1)
            dump[name] = {
                "metrics": [_timeless(r) for r in read_jsonl(run_dir / "metrics.jsonl")],
                "validation": [_timeless(r) for r in read_jsonl(run_dir / "validation.jsonl")],
                "events": [_timeless(r) for r in read_jsonl(run_dir / "events.jsonl")],
            }
            print(f"{name}: {len(dump[name]['metrics'])} steps", file=sys.stderr)
    out.write_text(json.dumps(dump, sort_keys=True, default=repr))


def _leaves(obj: Any, path: str = "") -> dict[str, Any]:
    """Flatten nested rows to path -> scalar."""
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _leaves(val, f"{path}/{key}").items()}
    if isinstance(obj, list):
        return {k: v for i, val in enumerate(obj) for k, v in _leaves(val, f"{path}[{i}]").items()}
    return {path: obj}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def compare(a_path: Path, b_path: Path, skip: set[str]) -> int:
    a = json.loads(a_path.read_text())
    b = json.loads(b_path.read_text())
    n = diffs = 0
    for name in sorted(set(a) | set(b)):
        if name in skip:
            continue
        la, lb = _leaves(a.get(name)), _leaves(b.get(name))
        for key in sorted(set(la) | set(lb)):
            n += 1
            if key not in la or key not in lb or not _same(la[key], lb[key]):
                diffs += 1
                if diffs <= 40:
                    print(f"DIFF {name}{key}: {la.get(key, '<missing>')!r} != {lb.get(key, '<missing>')!r}")
    compared = sorted((set(a) | set(b)) - skip)
    print(f"{len(compared)} configurations ({', '.join(compared)}): {n} values compared, {diffs} differences")
    return 1 if diffs else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the golden configurations; write their values as JSON")
    r.add_argument("out", type=Path)
    r.add_argument("--cache", type=Path, default=Path("outputs/base_cache"), help="warm-up cache directory")
    r.add_argument("--only", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    c = sub.add_parser("compare", help="compare two dumps; exit 1 on any difference")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--skip", nargs="*", default=[], help="configurations left out (an intended change)")
    args = p.parse_args()
    if args.cmd == "run":
        run_all(args.out, args.cache, args.only)
    else:
        sys.exit(compare(args.a, args.b, set(args.skip)))


if __name__ == "__main__":
    main()

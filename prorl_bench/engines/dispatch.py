"""Which trainer runs a job: ``engine.name`` -> the native trainer or TRL's (same signature, same run
directory). Both are imported only when a job runs, so ``--help`` and config errors stay fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prorl_bench.config import Config


def train(cfg: Config, run_dir: Path, cache_root: Path, **kw: Any) -> dict[str, Any]:
    """Run one experiment on ``cfg.engine.name``'s trainer (see ``run.trainer.train`` for ``kw``)."""
    if cfg.engine.name == "trl":
        from prorl_bench.engines.trl.config_map import refuse_for_trl
        from prorl_bench.engines.trl.run import train as trl_train

        refuse_for_trl(cfg)  # again: a config validated where the engines' checks were not loaded

        return trl_train(cfg, run_dir, cache_root, **kw)
    from prorl_bench.run.trainer import train as native_train

    return native_train(cfg, run_dir, cache_root, **kw)

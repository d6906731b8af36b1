"""Which trainer runs a job: ``engine.name`` looked up in ``registry.ENGINES`` (``engines/base.py``: the
protocol; the native trainer, TRL's, or a plugin's — same signature, same run directory). An engine's
heavy imports happen in its ``train``, so ``--help`` and config errors stay fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import prorl_bench.engines  # noqa: F401  (registers the built-in engines)
from prorl_bench.config import Config
from prorl_bench.engines.base import get_engine


def train(cfg: Config, run_dir: Path, cache_root: Path, **kw: Any) -> dict[str, Any]:
    """Run one experiment on ``cfg.engine.name``'s engine (see ``engines.base.Engine.train`` for ``kw``)."""
    engine = get_engine(cfg.engine.name)
    engine.check(cfg)  # again: a config validated where the engines' checks were not loaded
    return engine.train(cfg, run_dir, cache_root, **kw)

"""``engine=native``: the bench's own trainer (``run/trainer.py``) as an ``Engine``. It runs every knob
the config can express, so it refuses nothing beyond the config's own validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prorl_bench.config import Config
from prorl_bench.engines.base import register_engine


@register_engine("native")
class NativeEngine:
    """The bench's own trainer (run/trainer.py): every variant, growth, routing, every reset option."""

    def check(self, cfg: Config) -> None:
        """Nothing to refuse: the config's validation is the native trainer's."""

    def train(self, cfg: Config, run_dir: Path, cache_root: Path, **kw: Any) -> dict[str, Any]:
        """``run.trainer.train`` (imported here: torch only when a job runs)."""
        from prorl_bench.run.trainer import train

        return train(cfg, run_dir, cache_root, **kw)

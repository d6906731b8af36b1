"""``engine=trl``: TRL's ``GRPOTrainer`` built from the bench's config (``engines/trl/run.py``) as an
``Engine``. Its ``check`` refuses every knob TRL cannot express (``config_map.refuse_for_trl``: the
rules docs/engines.md is generated from). TRL and torch are imported only when a job runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prorl_bench.config import Config
from prorl_bench.engines.base import register_engine
from prorl_bench.engines.trl.config_map import refuse_for_trl


@register_engine("trl")
class TRLEngine:
    """TRL's GRPOTrainer built from the bench's config, writing the bench's run directory."""

    def check(self, cfg: Config) -> None:
        """ConfigError naming every key TRL cannot express, or a missing / untested TRL."""
        refuse_for_trl(cfg)

    def train(self, cfg: Config, run_dir: Path, cache_root: Path, **kw: Any) -> dict[str, Any]:
        """``engines.trl.run.train`` (TRL imported here)."""
        from prorl_bench.engines.trl.run import train

        return train(cfg, run_dir, cache_root, **kw)

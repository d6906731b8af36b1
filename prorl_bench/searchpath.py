"""Where Hydra finds configs: ``conf/`` (primary) and ``sweeps/`` (named grids, launch recipes).

``conf/config.yaml`` adds ``file://${prorl_bench_root:}/sweeps`` to ``hydra.searchpath``; the
``prorl_bench_root`` resolver registered here makes that path absolute, so sweeps are found from any
working directory (and in joblib / submitit worker processes, which import this package).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"
SWEEPS_DIR = ROOT / "sweeps"


def register_resolvers() -> None:
    """Register ``${prorl_bench_root:}`` (idempotent)."""
    if not OmegaConf.has_resolver("prorl_bench_root"):
        OmegaConf.register_new_resolver("prorl_bench_root", lambda: str(ROOT))

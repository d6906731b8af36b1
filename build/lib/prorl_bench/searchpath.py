"""Where Hydra finds configs: ``conf/`` (primary) and ``sweeps/`` (named grids, launch recipes).

One place defines both directories. In a checkout (or an editable install) they are the repository's
top-level ``conf/`` and ``sweeps/``; a wheel ships the same files inside the package as
``prorl_bench/_conf`` and ``prorl_bench/_sweeps`` (pyproject.toml maps them), and those are used when
present. ``conf/config.yaml`` adds ``file://${prorl_bench_sweeps:}`` to ``hydra.searchpath``; the
resolver registered here makes that path absolute, so sweeps are found from any working directory
(and in joblib / submitit worker processes, which import this package).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent  # the checkout (meaningful only when not installed as a wheel)


def _pick(installed: str, checkout: str) -> Path:
    inside = PACKAGE / installed
    return inside if inside.is_dir() else ROOT / checkout


CONF_DIR = _pick("_conf", "conf")
SWEEPS_DIR = _pick("_sweeps", "sweeps")


def register_resolvers() -> None:
    """Register ``${prorl_bench_sweeps:}`` (idempotent)."""
    if not OmegaConf.has_resolver("prorl_bench_sweeps"):
        OmegaConf.register_new_resolver("prorl_bench_sweeps", lambda: str(SWEEPS_DIR))

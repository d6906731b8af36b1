"""Optional dependencies (pip extras), imported on demand with one error message for all of them."""

from __future__ import annotations

import importlib
from types import ModuleType

from prorl_bench.registry import ConfigError


def require_extra(module: str, setting: str, extra: str) -> ModuleType:
    """Import ``module`` or raise ConfigError: ``setting`` (the config value that needs it) needs
    the extra ``extra`` (``pip install 'prorl-bench[extra]'``)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(
            f"{setting} needs the '{extra}' extra ({module} is not installed): pip install 'prorl-bench[{extra}]'"
        ) from e

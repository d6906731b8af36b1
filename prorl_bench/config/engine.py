"""``engine``: which trainer runs the RL loop — a registered engine (``registry.ENGINES``): the bench's
own (``native``), TRL's ``GRPOTrainer`` (``trl``, prorl_bench/engines/trl/), or a plugin's. Every engine
writes the same run directory (``engines/base.py``, docs/engines.md); what an engine cannot express is
refused before anything runs (its ``check``; TRL's rules are engines/trl/config_map.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prorl_bench.config.options import bind_params
from prorl_bench.registry import ENGINES


@dataclass
class TrlEngineParams:
    """``engine=trl``: the knobs of TRL's GRPOTrainer that have no counterpart in the native trainer."""

    # TRL's gradient checkpointing (its own default is on; off = the same work as native)
    gradient_checkpointing: bool = False


@dataclass
class EngineConfig:
    name: str = "native"  # a registered engine (registry.ENGINES): native | trl (pip install 'prorl-bench[trl]')
    params: Any = None  # the engine's parameters (its dataclass instance; flat keys engine.<name>)

    def __post_init__(self) -> None:
        self.params = bind_params(ENGINES, self.name, self.params)  # an unknown name lists the registered ones

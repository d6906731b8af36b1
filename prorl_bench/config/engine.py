"""``engine``: which trainer runs the RL loop — the bench's own (``native``) or TRL's ``GRPOTrainer``
(``trl``, prorl_bench/engines/trl/). Both write the same run directory (docs/engines.md); a knob TRL
cannot express is refused before anything runs (engines/trl/config_map.py)."""

from __future__ import annotations

from dataclasses import dataclass

from prorl_bench import registry

_require = registry.require  # ConfigError "invalid config value key=value: allowed ..." unless ok

ENGINES = ("native", "trl")


@dataclass
class EngineConfig:
    name: str = "native"  # native (the bench's trainer) | trl (TRL's GRPOTrainer; pip install 'prorl-bench[trl]')
    # trl: TRL's gradient checkpointing (its own default is on; off = the same work as native)
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        _require(self.name in ENGINES, "engine.name", self.name, " | ".join(ENGINES))

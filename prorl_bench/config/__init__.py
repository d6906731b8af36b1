"""Structured configs: the schema every YAML in ``conf/`` is merged into.

Hydra merges ``conf/<group>/<option>.yaml`` into these dataclasses, so

* an unknown option (``variant=Z``) fails in Hydra with the list of available options,
* a misspelled key (``algo.lrr=1``) fails with "Key 'lrr' not in 'AlgoConfig'",
* a value outside a closed set fails with the allowed values: an enum's, or for the pluggable axes
  (``algo.advantage``, ``kl_estimator.name``, ``task.name``, ``reset.trigger``, ``opt_reset.kind``,
  ``variant.reference``)
  the names registered in ``prorl_bench.registry`` — a new option registers itself next to its code,
* a value out of range fails in the group's ``__post_init__`` (it runs when ``OmegaConf.to_object``
  builds the dataclasses), naming the key and the allowed range.

All of this happens before any model is built or any step is trained.

One module per config group; this package re-exports every name, so ``from prorl_bench.config import X``
is the way in:

* ``enums.py``: the closed value sets (``ModelKind``, ``LossAgg``, ...),
* ``builtin_options.py``: the built-in options of every registry axis, declared (description,
  parameters with their defaults, config-time facts); their code registers in rl/ and tasks/,
* ``task.py``: ``task`` (and the parameters of task=reasoning_gym, code, math_jsonl),
* ``algo.py``: ``variant``, ``kl_estimator``, ``algo``, ``kl_ctl``,
* ``model.py``: ``model``, ``adapter``, ``hardware``, ``warmup``,
* ``events.py``: ``reset``, ``opt_reset``, ``growth``,
* ``routing.py``: ``detector``, ``route``,
* ``run.py``: ``checkpoint``, ``guard``, ``export``, ``tracking``, ``eval``,
* ``engine.py``: ``engine`` (native | trl),
* ``root.py``: ``Config`` (every group, the cross-group checks), ``register_configs``, ``to_config``.

Each field's comment is its ``prorl-bench --help`` text (prorl_bench/cli/confhelp.py reads it).
"""

from __future__ import annotations

from prorl_bench.config import builtin_options  # noqa: F401  (declares the built-in options first)
from prorl_bench.config.algo import (
    VARIANT_PRESETS,
    AdaptiveKLParams,
    AlgoConfig,
    KLConfig,
    KLControlConfig,
    VariantConfig,
)
from prorl_bench.config.engine import ENGINES, EngineConfig, TrlEngineParams
from prorl_bench.config.enums import (
    AdamWImpl,
    AdapterKind,
    AdapterReferenceKind,
    DecodeImpl,
    Device,
    DType,
    GrowthKind,
    HFImpl,
    K2Mode,
    KLControlKind,
    KLPlacement,
    LossAgg,
    Migration,
    ModelKind,
    NonFinitePolicy,
    PromptStyle,
    ResetSource,
    RewardKind,
    StallMetric,
    StepPolicy,
    UpdateNormMode,
)
from prorl_bench.config.events import GrowthConfig, OptResetConfig, RankGrowthParams, ResetConfig
from prorl_bench.config.model import (
    POSITIONS,
    AdapterConfig,
    DualLoraParams,
    HardwareConfig,
    LoraParams,
    ModelConfig,
    WarmupConfig,
)
from prorl_bench.config.root import GRID_KEYS, MAX_SEED, Config, as_dict, register_configs
from prorl_bench.config.routing import DetectorConfig, PenalizeParams, RouteAdvantages, RouteConfig, RouteUse
from prorl_bench.config.run import CheckpointConfig, EvalConfig, ExportConfig, GuardConfig, TrackingConfig
from prorl_bench.config.task import CodeTaskConfig, MathJsonlConfig, ReasoningGymConfig, TaskConfig
from prorl_bench.config.validate import complete, to_config
from prorl_bench.registry import ConfigError

__all__ = [
    # root
    "Config",
    "ConfigError",
    "GRID_KEYS",
    "MAX_SEED",
    "register_configs",
    "complete",
    "as_dict",
    "to_config",
    # groups
    "AdapterConfig",
    "AlgoConfig",
    "CheckpointConfig",
    "CodeTaskConfig",
    "MathJsonlConfig",
    "DetectorConfig",
    "ENGINES",
    "EngineConfig",
    "EvalConfig",
    "ExportConfig",
    "GrowthConfig",
    "GuardConfig",
    "HardwareConfig",
    "KLConfig",
    "KLControlConfig",
    "ModelConfig",
    "OptResetConfig",
    "ReasoningGymConfig",
    "ResetConfig",
    "RouteConfig",
    "TaskConfig",
    "TrackingConfig",
    "VariantConfig",
    "WarmupConfig",
    "POSITIONS",
    "VARIANT_PRESETS",
    # a kind's or an engine's parameters (flat keys of its section)
    "AdaptiveKLParams",
    "DualLoraParams",
    "LoraParams",
    "PenalizeParams",
    "RankGrowthParams",
    "TrlEngineParams",
    # enums
    "AdamWImpl",
    "AdapterKind",
    "AdapterReferenceKind",
    "DType",
    "DecodeImpl",
    "Device",
    "GrowthKind",
    "HFImpl",
    "K2Mode",
    "KLControlKind",
    "KLPlacement",
    "LossAgg",
    "Migration",
    "ModelKind",
    "NonFinitePolicy",
    "PromptStyle",
    "ResetSource",
    "RewardKind",
    "RouteAdvantages",
    "RouteUse",
    "StallMetric",
    "StepPolicy",
    "UpdateNormMode",
]

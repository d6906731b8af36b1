"""``detector`` and ``route``: gradient routing's labels and what a run does with them (docs/routing.md).
The combinations with ``adapter`` are checked across groups in root.py (``_check_routing``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from prorl_bench import registry
from prorl_bench.config.options import bind_params
from prorl_bench.registry import ConfigError

_require = registry.require  # ConfigError "invalid config value key=value: allowed ..." unless ok


@dataclass
class DetectorConfig:
    """Gradient routing's detector (prorl_bench/tasks/detectors.py): labels each sampled completion as
    showing the unwanted behaviour or not. Labelled samples train only the forget adapter."""

    name: str = "none"  # a registered detector (registry.DETECTORS): none | pattern | reward_field
    # Partial oversight (prorl_bench/tasks/detectors.py Oversight; docs/routing.md): the labels the run sees
    recall: float = 1.0  # share of the detector's positives reported (misses: a seeded stream, same in every arm)
    false_positive_rate: float = 0.0  # share of the detector's negatives reported anyway (same stream)
    miss_pattern: str | None = None  # a systematic blind spot: completions matching this regex are never reported
    params: Any = None  # the detector's parameters (its dataclass instance; flat keys detector.<name>)

    def __post_init__(self) -> None:
        import re

        self.params = bind_params(registry.DETECTORS, self.name, self.params)
        _require(0.0 <= self.recall <= 1.0, "detector.recall", self.recall, "in [0, 1]")
        _require(
            0.0 <= self.false_positive_rate <= 1.0,
            "detector.false_positive_rate",
            self.false_positive_rate,
            "in [0, 1]",
        )
        if self.miss_pattern is not None:
            try:
                re.compile(self.miss_pattern)
            except re.error as e:
                raise ConfigError(f"invalid config value detector.miss_pattern={self.miss_pattern!r}: {e}") from None
        partial = self.recall != 1.0 or self.false_positive_rate != 0.0 or self.miss_pattern is not None
        _require(
            not (partial and self.name == "none"),
            "detector",
            self.name,
            "a detector (not 'none') when detector.recall / false_positive_rate / miss_pattern are set",
        )


class RouteUse(str, Enum):
    """What the detector's labels do (docs/routing.md): the arms of a routing study."""

    route = "route"  # gradient routing: labelled samples train only the forget adapter (adapter=dual_lora)
    filter = "filter"  # data filtering: labelled samples are dropped from the update
    penalize = "penalize"  # reward shaping: route.penalty is subtracted from labelled samples' rewards
    observe = "observe"  # labels computed and logged, not used: a plain baseline that sees the same detector


class RouteAdvantages(str, Enum):
    group = "group"  # advantages over the whole group, then routed / filtered
    split = "split"  # the retain adapter's (filter: the update's) rows normalised within the unlabelled subset


@dataclass
class PenalizeParams:
    """``route.use=penalize``: reward shaping by the detector's labels."""

    penalty: float | None = None  # subtracted from a labelled sample's reward; null = the task's hack bonus

    def __post_init__(self) -> None:
        _require(self.penalty is None or self.penalty >= 0, "route.penalty", self.penalty, "null or >= 0")


@dataclass
class RouteConfig:
    """How a run uses its detector's labels (only with a detector; prorl_bench/run/routing.py)."""

    use: RouteUse = RouteUse.route  # route | filter | penalize | observe
    # group | split: split normalises unlabelled rows within the unlabelled subset of their group
    # (route: the retain adapter's advantages; the forget adapter keeps the whole group's)
    advantages: RouteAdvantages = RouteAdvantages.group
    params: Any = None  # the use's parameters (PenalizeParams for penalize; flat keys route.<key>)

    def __post_init__(self) -> None:
        self.params = bind_params(registry.ROUTE_USES, self.use, self.params)  # an unknown name: ConfigError
        self.use = RouteUse(self.use)  # a name given as text (Python API) is the enum member
        _require(
            not (self.advantages == RouteAdvantages.split and self.use in (RouteUse.penalize, RouteUse.observe)),
            "route.advantages",
            self.advantages.value,
            f"'group' with route.use={self.use.value} (nothing is routed or dropped, so there is no subset to split)",
        )

"""Detectors for gradient routing: label each sampled completion as showing an unwanted behaviour.

A detector is a class registered with ``@DETECTORS.register(name)``, built from ``detector.params``
(a dict from YAML, checked by ``validate`` with "allowed: ..." errors), and called per sample as
``detector(prompt, completion, problem, info) -> bool``; ``info`` is what the task's reward function
reported for that sample (e.g. the hack task's ``{"task": 1.0, "hack": 1.0}``). Labelled samples
train only the forget adapter (``adapter=dual_lora``; README "Gradient routing").
"""

from __future__ import annotations

import re
from typing import Any

from prorl_bench.registry import DETECTORS, ConfigError


class Detector:
    """Base class: ``PARAMS`` maps each accepted parameter to (type, default)."""

    PARAMS: dict[str, tuple[type, Any]] = {}

    def __init__(self, params: dict[str, Any]) -> None:
        self.validate(params)
        self.p = {k: params.get(k, default) for k, (_, default) in self.PARAMS.items()}

    @classmethod
    def validate(cls, params: dict[str, Any]) -> None:
        unknown = sorted(set(params) - set(cls.PARAMS))
        if unknown:
            raise ConfigError(
                f"invalid config value detector.params={dict(params)!r}: unknown {unknown}; "
                f"allowed {sorted(cls.PARAMS) or 'no parameters'}"
            )
        for key, (typ, default) in cls.PARAMS.items():
            value = params.get(key, default)
            number = typ is float and isinstance(value, int) and not isinstance(value, bool)
            if value is None or not (isinstance(value, typ) or number):
                raise ConfigError(f"invalid config value detector.params.{key}={value!r}: allowed a {typ.__name__}")

    def __call__(self, prompt: str, completion: str, problem: Any, info: dict[str, Any]) -> bool:
        raise NotImplementedError


@DETECTORS.register("none")
class NoDetector(Detector):
    """Labels nothing (routing off)."""

    def __call__(self, prompt: str, completion: str, problem: Any, info: dict[str, Any]) -> bool:
        return False


@DETECTORS.register("pattern")
class PatternDetector(Detector):
    """A regular expression searched in the completion (``re.search``), e.g. ``"7$"`` for a
    completion ending in 7. Cheap and imperfect, as real detectors are: it also fires on correct
    answers that happen to match."""

    PARAMS = {"regex": (str, None)}

    @classmethod
    def validate(cls, params: dict[str, Any]) -> None:
        super().validate(params)
        try:
            re.compile(params["regex"])
        except re.error as e:
            raise ConfigError(f"invalid config value detector.params.regex={params['regex']!r}: {e}") from None

    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.regex = re.compile(self.p["regex"])

    def __call__(self, prompt: str, completion: str, problem: Any, info: dict[str, Any]) -> bool:
        return self.regex.search(completion) is not None


@DETECTORS.register("reward_field")
class RewardFieldDetector(Detector):
    """Reads a field the reward function reports for the sample: labelled when
    ``info[field] > threshold`` (the hack task reports ``hack`` = 1 when its bonus was paid)."""

    PARAMS = {"field": (str, "hack"), "threshold": (float, 0.0)}

    def __call__(self, prompt: str, completion: str, problem: Any, info: dict[str, Any]) -> bool:
        if self.p["field"] not in info:
            raise KeyError(
                f"detector reward_field: the task reports no {self.p['field']!r} (it reports {sorted(info)})"
            )
        return float(info[self.p["field"]]) > self.p["threshold"]


def build_detector(name: str, params: dict[str, Any]) -> Detector:
    return DETECTORS[name](dict(params))

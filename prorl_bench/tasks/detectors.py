"""Detectors for gradient routing: label each sampled completion as showing an unwanted behaviour.

The built-in detectors are declared (description, parameters) in ``config/builtin_options.py`` and
registered here with their code. A detector is a class registered with
``@DETECTORS.register(name, params=Dataclass)``, built with its
parameters bound (flat keys of the ``detector`` section, ``detector.regex``), and called per sample as
``detector(prompt, completion, problem, info) -> bool``; ``info`` is what the task's reward function
reported for that sample (e.g. the hack task's ``{"task": 1.0, "hack": 1.0}``). Labelled samples
train only the forget adapter (``adapter=dual_lora``; README "Gradient routing").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from prorl_bench.config.builtin_options import PatternParams
from prorl_bench.registry import DETECTORS


class Detector:
    """Base class. A detector with parameters registers their dataclass (``params=``; flat keys of the
    ``detector`` section, ``detector.regex``) and receives the checked instance as ``params``."""

    def __init__(self, params: Any = None) -> None:
        self.params = params

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

    def __init__(self, params: PatternParams) -> None:
        super().__init__(params)
        self.regex = re.compile(params.regex)

    def __call__(self, prompt: str, completion: str, problem: Any, info: dict[str, Any]) -> bool:
        return self.regex.search(completion) is not None


@DETECTORS.register("reward_field")
class RewardFieldDetector(Detector):
    """Reads a field the reward function reports for the sample: labelled when
    ``info[field] > threshold`` (the hack task reports ``hack`` = 1 when its bonus was paid)."""

    def __call__(self, prompt: str, completion: str, problem: Any, info: dict[str, Any]) -> bool:
        p = self.params
        if p.field not in info:
            raise KeyError(f"detector reward_field: the task reports no {p.field!r} (it reports {sorted(info)})")
        return float(info[p.field]) > p.threshold


def build_detector(name: str, params: Any = None) -> Detector:
    """The detector ``name`` with its parameters bound (the checked instance, or a mapping checked here)."""
    return DETECTORS.build(name, params)()


# --------------------------------------------------------------------------- partial oversight

STREAM_SALT = 0x9E3779B97F4A7C15  # mixes (seed, step) into one 63-bit generator seed


def stream_uniforms(seed: int, step: int, n: int) -> torch.Tensor:
    """(n, 2) float64 uniforms in [0, 1) for the samples of one rollout: column 0 decides a miss of
    a positive, column 1 a false positive on a negative. A function of (seed, step, sample index)
    only — common random numbers: every arm of a study (routed, filter, penalize) with the same seed
    draws the same numbers for sample i of step t, whatever its policy sampled."""
    mixed = (seed * STREAM_SALT + step * 1_000_003 + 0x5EED) % (2**63 - 1)
    return torch.rand(n, 2, generator=torch.Generator().manual_seed(mixed), dtype=torch.float64)


class Oversight:
    """The detector as the run sees it: partial oversight over an inner detector.

    For sample i of step t with uniforms (u, v) = ``stream_uniforms(seed, t, n)[i]``:
    reported = (inner(i) and u < recall and not blind(i)) or (not inner(i) and v < false_positive_rate),
    where blind(i) = the completion matches ``miss_pattern`` (a systematic miss: hacks of one form are
    never reported, e.g. ``"^!"``). With recall 1, rate 0 and no pattern the labels are the inner
    detector's. ``last`` holds the step's ``route/detector/{recall,precision}`` against the task's
    ground-truth ``info["hack"]`` (NaN when the step has no hack / no report; absent when the task
    reports no hack flag).
    """

    def __init__(self, inner: Detector, seed: int, recall: float, false_positive_rate: float, miss_pattern: str | None):
        self.inner = inner
        self.seed = seed
        self.recall = recall
        self.fpr = false_positive_rate
        self.blind = re.compile(miss_pattern) if miss_pattern is not None else None
        self.last: dict[str, float] = {}

    def __call__(
        self, step: int, problems: Sequence[Any], texts: Sequence[str], infos: Sequence[dict[str, Any]]
    ) -> list[bool]:
        """Labels of one rollout's samples (True = reported)."""
        u = stream_uniforms(self.seed, step, len(texts)).tolist()
        out = []
        for (miss_u, fp_u), p, t, i in zip(u, problems, texts, infos):
            if self.inner(p.prompt, t, p, i):
                out.append(miss_u < self.recall and not (self.blind is not None and self.blind.search(t)))
            else:
                out.append(fp_u < self.fpr)
        self.last = detector_quality(out, infos)
        return out


def detector_quality(reported: Sequence[bool], infos: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``route/detector/recall`` = reported hacks / hacks, ``route/detector/precision`` = reported
    hacks / reports, against ``info["hack"]`` (NaN when the denominator is 0; {} without the flag)."""
    if not infos or "hack" not in infos[0]:
        return {}
    truth = [bool(i["hack"]) for i in infos]
    hit = sum(r and h for r, h in zip(reported, truth))
    hacks, reports = sum(truth), sum(reported)
    return {
        "route/detector/recall": hit / hacks if hacks else float("nan"),
        "route/detector/precision": hit / reports if reports else float("nan"),
    }

"""A study's declared question: primary endpoints, baseline arm, equivalence margins, seed blocks.

A named study (``sweeps/sweep/<study>.yaml``) states *before it runs* what it tests, in a ``study:``
node validated here (unknown keys and a study without a primary endpoint are refused):

    study:
      question: Does the optimizer-state transform at a reset change held-out success vs keep?
      primary:                      # the multiple-comparison family is primary x arms, nothing else
        - {metric: val_pass1_final, direction: higher, margin: 0.03}
      baseline: keep                # group label every arm is compared with
      block: explore                # which seed block this sweep runs (study.block=confirm)
      blocks: {explore: "range(0,16)", confirm: "range(16,32)"}   # Hydra sweep syntax, disjoint

``metric`` is a per-run column of the aggregate tables (``metric_catalog.METRICS``); ``direction`` says
which way is better (it words the verdict; every test is two-sided); ``margin`` (metric units) is
what the study accepts as "no effect": without it no cell can be called equivalent. The grid's
``hydra.sweeper.params.seed`` is ``${study.blocks.${study.block}}``, so ``study.block=confirm``
runs the same grid on the confirm seeds; every job checks that its seed belongs to its block.
See docs/studies.md for the statistics and the verdicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from prorl_bench.config.metric_catalog import METRIC_NAMES
from prorl_bench.registry import ConfigError

REQUIRED_BLOCKS = ("explore", "confirm")


class Direction(str, Enum):
    higher = "higher"  # a larger value of the metric is better (success, pass@k)
    lower = "lower"  # a smaller value is better (hack rate, KL)


@dataclass
class Endpoint:
    """One primary endpoint: a per-run metric, which way is better, the equivalence margin."""

    metric: str = ""  # a column of runs.csv (prorl_bench/config/metric_catalog.py: METRICS), e.g. val_pass1_final
    direction: Direction | None = None  # higher | lower: which way is better (tests stay two-sided)
    margin: float | None = None  # equivalence margin in the metric's units; null: no equivalence claim

    def validate(self, where: str) -> None:

        if self.metric not in METRIC_NAMES:
            raise ConfigError(f"{where}.metric={self.metric!r} is not a per-run metric; one of {METRIC_NAMES}")
        if self.direction is None:
            raise ConfigError(f"{where}.direction is required: higher or lower (which way is better)")
        if self.margin is not None and not (math.isfinite(self.margin) and self.margin > 0):
            raise ConfigError(
                f"{where}.margin={self.margin} must be a finite number > 0 (or null: no equivalence test)"
            )


def parse_seeds(spec: str, where: str) -> list[int]:
    """Seeds of a block in Hydra's sweep syntax (``range(0,16)``, ``0,1,2``) as a list of ints."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        override = OverridesParser.create().parse_overrides([f"seed={spec}"])[0]
    except Exception as e:  # Hydra's grammar error names the bad character
        raise ConfigError(f"{where}={spec!r} is not a seed list in Hydra sweep syntax ({e})") from e
    values = list(override.sweep_iterator()) if override.is_discrete_sweep() else [override.value()]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ConfigError(f"{where}={spec!r}: seeds must be integers >= 0, got {values}")
    if len(set(values)) != len(values):
        raise ConfigError(f"{where}={spec!r}: a seed occurs twice")
    if len(values) < 2:
        raise ConfigError(f"{where}={spec!r}: a block needs >= 2 seeds (a paired test needs pairs)")
    return values


@dataclass
class StudyConfig:
    """What a study tests, declared before it runs (module docstring; docs/studies.md)."""

    question: str = ""  # the question in one sentence
    primary: list[Endpoint] = field(default_factory=list)  # primary endpoints: the Holm family x arms
    baseline: str = ""  # group label of the baseline arm (as the aggregate table names it)
    block: str = "explore"  # which seed block this sweep runs: explore | confirm
    blocks: dict[str, str] = field(default_factory=dict)  # block -> seeds (Hydra sweep syntax), disjoint

    @property
    def declared(self) -> bool:
        """Whether the grid declares a study (an all-empty node is "no study": plain grids, single runs)."""
        return bool(self.question or self.primary or self.baseline or self.blocks)

    def __post_init__(self) -> None:
        if not self.declared:
            if self.block != "explore":
                raise ConfigError(
                    f"study.block={self.block!r}, but no study is declared: seed blocks come from a study grid's "
                    "`study:` node (sweeps/sweep/<study>.yaml, docs/studies.md)"
                )
            return
        if not self.primary:
            raise ConfigError(
                "study.primary is empty: a study declares at least one primary endpoint "
                "({metric: ..., direction: higher|lower, margin: ...}) before it runs"
            )
        for i, e in enumerate(self.primary):
            e.validate(f"study.primary[{i}]")
        metrics = [e.metric for e in self.primary]
        if len(set(metrics)) != len(metrics):
            raise ConfigError(f"study.primary lists a metric twice: {metrics}")
        if not self.question.strip():
            raise ConfigError("study.question is empty: state the question the study answers")
        if not self.baseline:
            raise ConfigError("study.baseline is empty: name the group every arm is compared with")
        missing = [b for b in REQUIRED_BLOCKS if b not in self.blocks]
        if missing:
            raise ConfigError(f"study.blocks needs {' and '.join(REQUIRED_BLOCKS)} seed blocks; missing {missing}")
        if self.block not in self.blocks:
            raise ConfigError(f"study.block={self.block!r} is not one of study.blocks ({sorted(self.blocks)})")
        seen: dict[int, str] = {}
        for name in self.blocks:
            for s in self.seeds(name):
                if s in seen:
                    raise ConfigError(
                        f"study.blocks: seed {s} is in both {seen[s]!r} and {name!r} (blocks are disjoint)"
                    )
                seen[s] = name

    def seeds(self, block: str | None = None) -> list[int]:
        """The seeds of ``block`` (default: this sweep's block)."""
        name = block or self.block
        return parse_seeds(self.blocks[name], f"study.blocks.{name}")

    def check_seed(self, seed: int) -> None:
        """A job's seed must belong to its block: a confirm-labelled run on explore seeds is refused."""
        if not self.declared:
            return
        seeds = self.seeds()
        if seed not in seeds:
            raise ConfigError(
                f"seed={seed} is not in study block {self.block!r} (seeds {self.blocks[self.block]}); "
                f"run the block's seeds or pick another block (study.block=...)"
            )

    def endpoint(self, metric: str) -> Endpoint | None:
        return next((e for e in self.primary if e.metric == metric), None)


def study_from_dict(node: dict[str, Any]) -> StudyConfig:
    """A validated StudyConfig from a plain dict (a run's resolved config), as the CLI would build it."""
    from omegaconf import OmegaConf

    try:
        obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(StudyConfig), node))
    except ConfigError:
        raise
    except Exception as e:  # unknown key, wrong type
        raise ConfigError(f"study: {e}".splitlines()[0]) from e
    assert isinstance(obj, StudyConfig)
    return obj

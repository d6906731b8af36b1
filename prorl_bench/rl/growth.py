"""Topology growth: when the adapter rank grows, and what happens to the optimizer state.

Migration policies for the replaced adapter parameters (``GrownParam``: old tensor -> new, larger
tensor, with the slice of the new tensor the old one occupies):

* ``preserve``  the old slice keeps its exact m and v — mapped *by index* (``new[slices] = old``),
                never by flat prefix, which misplaces rows when a non-leading dimension grows
                (NOMA's realloc pitfall; LoRA B grows along dim 1) — new entries start at 0 and the
                step counter is kept.
* ``reset``     the grown adapters start with fresh state (step 0); all other state is kept.
* ``naive``     the common silent bug, kept as a labelled baseline: rebuild the optimizer on the new
                parameter objects, losing every parameter's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from prorl_bench.config import Migration, RankGrowthParams, ResetConfig, StallMetric
from prorl_bench.models.lora import GrownParam
from prorl_bench.rl.opt_state import check_adam_state
from prorl_bench.rl.resets import ResetSchedule


def migrate_optimizer(
    optimizer: torch.optim.Optimizer,
    grown: list[GrownParam],
    migration: Migration,
    rebuild: Callable[[], torch.optim.Optimizer],
) -> tuple[torch.optim.Optimizer, dict[str, Any]]:
    """Point the optimizer at the new parameters and migrate their state. Returns the optimizer
    (a new object only for ``naive``) and a description for the growth event."""
    check_adam_state(optimizer)
    states_before = sum(1 for s in optimizer.state.values() if s)
    if migration == Migration.naive:
        return rebuild(), {"migration": "naive", "states_lost": states_before}
    mapping = {id(g.old): g for g in grown}
    for group in optimizer.param_groups:
        group["params"] = [mapping[id(p)].new if id(p) in mapping else p for p in group["params"]]
    moved = 0
    for g in grown:
        old = optimizer.state.pop(g.old, None)
        if migration == Migration.preserve and old:
            new = {
                "step": old["step"].clone(),
                "exp_avg": torch.zeros_like(g.new, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(g.new, memory_format=torch.preserve_format),
            }
            new["exp_avg"][g.slices] = old["exp_avg"]
            new["exp_avg_sq"][g.slices] = old["exp_avg_sq"]
            optimizer.state[g.new] = new
            moved += 1
    lost = states_before - sum(1 for s in optimizer.state.values() if s)
    return optimizer, {"migration": migration.value, "states_moved": moved, "states_lost": lost}


class GrowthSchedule:
    """Decides whether the adapter rank grows at a step boundary: every ``grow_every`` steps, at
    reference resets, and/or when the held-out metric stalls — never beyond ``max_rank``."""

    def __init__(self, cfg: RankGrowthParams, metric: StallMetric) -> None:
        self.cfg = cfg
        self.periodic = ResetSchedule(ResetConfig(trigger="periodic", params={"every": max(cfg.grow_every, 1)}))
        self.stall = ResetSchedule(ResetConfig(trigger="stall", metric=metric, params={"patience": cfg.patience}))

    def observe_validation(self, value: float) -> None:
        if self.cfg.on_stall:
            self.stall.observe_validation(value)

    def due(self, step: int, rank: int, reset_happened: bool) -> str | None:
        c = self.cfg
        reasons = []
        if c.grow_every > 0 and self.periodic.due(step):
            reasons.append(f"every {c.grow_every} steps")
        if c.at_reset and reset_happened:
            reasons.append("reference reset")
        if c.on_stall and self.stall.due(step):
            self.stall.mark_reset(step)
            reasons.append("validation stall")
        if not reasons or rank + c.rank_step > c.max_rank:
            return None
        return ", ".join(reasons)

    def state_dict(self) -> dict[str, Any]:
        return {"periodic": self.periodic.state_dict(), "stall": self.stall.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.periodic.load_state_dict(state["periodic"])
        self.stall.load_state_dict(state["stall"])

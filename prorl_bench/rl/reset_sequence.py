"""The reset sequence at an RL-step boundary, one implementation for every engine.

Both engines call it: the native trainer (``run/step_events.reset_phase``) and TRL's
``ReferenceResetCallback`` (``engines/trl/callback.py``, which the TRL engine drives and a plain TRL
script can use). What differs between them is only *where* the objects live — the reference strategy
and the bench's ``LRSchedule`` natively; TRL's ``ref_model`` (or a PEFT ``ref`` adapter), TRL's AdamW
and an LR factor inside TRL's ``LambdaLR`` under TRL — so each engine hands the sequence a
``ResetTarget`` and the order of operations, the optimizer transform and the LR-restart rule are the
same code:

1. ``decide``: the step's typed signals (the KL to the reference, a stall metric) go to the trigger,
   which says whether and why a reset is due (``ResetSchedule``: trigger and ``min_spacing``);
2. ``reset``: the reference moves (a copy for alpha = 1, an alpha-mix otherwise:
   ``ResetTarget.move_reference``); the optimizer state is transformed (``opt_state.apply_opt_reset``);
   the LR schedule restarts when the transform asks for it (``lr_restart_warmup``); the trigger is told
   a reset happened. The returned dict is the ``reset`` event's fields (docs/outputs.md).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from prorl_bench.registry import OPT_TRANSFORMS
from prorl_bench.rl.opt_state import apply_opt_reset, moment_norms
from prorl_bench.rl.resets import ResetSchedule


class ResetTarget(Protocol):
    """What a reset changes, as one engine holds it."""

    def reset_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer whose state the transform changes (the unwrapped AdamW)."""
        ...

    def move_reference(self, alpha: float) -> dict[str, Any]:
        """Move the reference to the policy (``alpha`` = 1: a copy; else an alpha-mix); the event's
        fields that describe it (the KL just before and after it; a PEFT reference's layout)."""
        ...

    def restart_lr(self, start_step: int, warmup: int) -> None:
        """Restart the LR schedule at RL step ``start_step`` with ``warmup`` warm-up steps."""
        ...

    def after_reset(self, step: int) -> dict[str, Any]:
        """What follows the reset in this engine (an adaptive beta restored) and its event fields
        (``next_lr`` at least)."""
        ...


def lr_restart_warmup(o: Any, lr_warmup_steps: int) -> int | None:
    """The LR-restart rule that goes with an optimizer transform (``opt_reset`` group ``o``): the
    warm-up steps the schedule restarts with at the next step, or None (the schedule goes on). A
    transform that resets Adam's step is a fresh optimizer and comes with a fresh schedule (at least
    the run's own warm-up); any other restarts only when ``opt_reset.rewarmup_steps`` > 0."""
    if OPT_TRANSFORMS.meta(o.kind).get("step") == "reset":
        return max(lr_warmup_steps, o.rewarmup_steps)
    return o.rewarmup_steps if o.rewarmup_steps > 0 else None


def decide(schedule: ResetSchedule, step: int, kl: float | None, metric: float | None = None) -> str | None:
    """The trigger's decision at the end of RL ``step`` from the step's typed signals: ``kl``, the KL
    to the reference (None: no reference, or the engine measured none); ``metric``, an observation
    of a stall trigger's metric at this boundary (None: none; held-out evaluations are fed by the
    engine's validation phase). The reason for a reset, or None."""
    if metric is not None:
        schedule.observe_validation(metric)
    schedule.observe_step(step, kl)
    return schedule.due(step)


def reset(
    schedule: ResetSchedule, step: int, opt_reset: Any, lr_warmup_steps: int, target: ResetTarget
) -> dict[str, Any]:
    """The reset at the end of RL ``step`` (module docstring, 2): reference, optimizer state, LR
    schedule, in that order; the trigger marks it. ``opt_reset``: the ``opt_reset`` group;
    ``lr_warmup_steps``: the run's own warm-up (RL steps), the least a fresh optimizer re-warms."""
    alpha = schedule.alpha
    optimizer = target.reset_optimizer()
    m_before, v_before = moment_norms(optimizer)
    moved = target.move_reference(alpha)
    opt_info = apply_opt_reset(optimizer, opt_reset)
    warmup = lr_restart_warmup(opt_reset, lr_warmup_steps)
    if warmup is not None:
        target.restart_lr(step + 1, warmup)
    m_after, v_after = moment_norms(optimizer)
    schedule.mark_reset(step)
    return {
        "action": "polyak" if alpha < 1.0 else "copy",
        "alpha": alpha,
        **moved,
        **opt_info,
        "m_norm_before": m_before,
        "m_norm_after": m_after,
        "v_norm_before": v_before,
        "v_norm_after": v_after,
        **target.after_reset(step),
    }

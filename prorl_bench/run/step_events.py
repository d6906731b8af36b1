"""Step events at the step boundary: reference resets (the sequence every engine shares,
``rl/reset_sequence.py``, on the native run's objects) and adapter rank growth (with the
optimizer-state migration)."""

from __future__ import annotations

from typing import Any

import torch

from prorl_bench.config import AdapterKind, LossAgg, ResetSource
from prorl_bench.models.lora import adapter_rank, grow_rank
from prorl_bench.models.rollout import Rollout, chunked_logprobs
from prorl_bench.rl import reset_sequence
from prorl_bench.rl.growth import migrate_optimizer
from prorl_bench.rl.reset_sequence import lr_restart_warmup
from prorl_bench.run.kl_measure import mean_kl
from prorl_bench.run.lifecycle import RunState
from prorl_bench.run.phases import count_policy_forward
from prorl_bench.run.setup import RunContext, build_optimizer
from prorl_bench.run.step_signals import GrowthDecision, KLStats, ResetDecision

__all__ = ["NativeReset", "grow_phase", "lr_restart_warmup", "reset_phase"]  # lr_restart_warmup: rl/reset_sequence


def reset_phase(ctx: RunContext, s: RunState, out: Any, batch: Rollout, kl: KLStats, step: int) -> ResetDecision:
    """Reference reset at the step boundary (variant C), by the sequence every engine shares
    (``rl/reset_sequence.py``): the trigger reads the step's typed KL to the reference; a reset moves
    the reference weights, then the optimizer state, then the LR schedule; then the adaptive KL
    coefficient sees the step's KL (to pi_old for B)."""
    ref, cfg = s.ref, ctx.cfg
    if ref.exists:
        decision = ResetDecision(reset_sequence.decide(s.resets, step, kl.ref))
    else:  # no reference to reset: the trigger still sees the step
        s.resets.observe_step(step, None)
        decision = ResetDecision()
    if decision.happened:
        with ctx.acct.stage("reset"):
            target = NativeReset(ctx, s, batch)
            info = reset_sequence.reset(s.resets, step, cfg.opt_reset, cfg.algo.lr_warmup_steps, target)
        out.event(step, "reset", decision.reason, **info)
    s.kl_ctl.update(kl.for_controller(ref.exists))
    return decision


def grow_phase(ctx: RunContext, s: RunState, out: Any, reset: ResetDecision, step: int) -> GrowthDecision:
    """Topology growth: the adapter rank grows (a trigger may follow the step's reset), the optimizer
    state is migrated by index."""
    why = s.growth.due(step, adapter_rank(s.policy), reset.happened) if s.growth is not None else None
    if why is not None:
        with ctx.acct.stage("growth"):
            s.optimizer, info = _grow(ctx.cfg, step, s.policy, s.ref, s.optimizer)
        out.event(step, "growth", why, **info)
    return GrowthDecision(why, adapter_rank(s.policy) if ctx.cfg.adapter.kind == AdapterKind.lora else None)


class NativeReset:
    """The native run's ``ResetTarget`` (``rl/reset_sequence.py``): its reference strategy, AdamW, LR
    schedule and KL controller. The KL of the current policy to the reference is measured on this
    step's rollout just before and just after the reference moves (one policy and two reference
    forwards, charged to time/reset)."""

    def __init__(self, ctx: RunContext, s: RunState, batch: Rollout) -> None:
        self.ctx, self.s, self.batch = ctx, s, batch
        self.source: dict[str, Any] = {}

    def reset_optimizer(self) -> torch.optim.Optimizer:
        return self.s.optimizer

    def move_reference(self, alpha: float) -> dict[str, Any]:
        ctx, s, batch = self.ctx, self.s, self.batch
        t = ctx.cfg.algo.temperature
        logp = chunked_logprobs(s.policy, batch, t, ctx.banned, ctx.mb_size)
        count_policy_forward(ctx.acct, s.policy, batch, backward=False)

        def kl_now() -> float:
            s.ref.forward_cost(ctx.acct, batch)
            lr = chunked_logprobs(s.ref.model, batch, t, ctx.banned, ctx.mb_size)
            return float(mean_kl("k3", logp, lr, batch.completion_mask, LossAgg.token))

        kl_before = kl_now()
        weights, self.source = _reset_source(ctx.cfg, s)
        s.ref.reset_to(s.policy, alpha, weights)
        return {"kl_before": kl_before, "kl_after": kl_now()}

    def restart_lr(self, start_step: int, warmup: int) -> None:
        self.s.schedule.restart(start_step, warmup)

    def after_reset(self, step: int) -> dict[str, Any]:
        if self.ctx.cfg.reset.restore_beta:
            self.s.kl_ctl.restore()
        return {"next_lr": self.s.schedule.lr(step + 1), "beta_after": self.s.kl_ctl.value, **self.source}


def _reset_source(cfg, s: RunState) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any]]:
    """The weights a reset moves the reference to (None: the current policy) and the event's fields
    that say so. ``reset.source=current`` adds no field (its events are those of every earlier
    version); ``best`` adds ``source`` (what was used: ``best``, or ``current`` before the first
    regular evaluation, with ``source_reason``), ``best_step`` and ``best_score`` (held-out pass@1)."""
    if cfg.reset.source != ResetSource.best:
        return None, {}
    best = s.best
    if best is None or not best.exists:
        why = f"reset.source=best: no regular held-out evaluation yet (the first is at step {cfg.eval_every})"
        return None, {"source": "current", "source_reason": why, "best_step": None, "best_score": None}
    return best.weights_for(s.policy), {"source": "best", "best_step": best.step, "best_score": best.score}


def _grow(cfg, step, policy, ref, optimizer) -> tuple[torch.optim.Optimizer, dict[str, Any]]:
    """Grow every adapter by growth.rank_step — the reference grows with identical new rows, so
    it keeps its function and stays reset-compatible — and migrate the optimizer state."""
    old_rank = adapter_rank(policy)
    trainable_before = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    models = [policy, *ref.models()]
    grown = grow_rank(models, old_rank + cfg.growth.params.rank_step, seed=cfg.seed * 1_000_003 + step)
    optimizer, info = migrate_optimizer(
        optimizer, grown[0], cfg.growth.params.migration, rebuild=lambda: build_optimizer(policy, cfg.algo)
    )
    return optimizer, {
        "old_rank": old_rank,
        "new_rank": adapter_rank(policy),
        "trainable_params_before": trainable_before,
        "trainable_params_after": sum(p.numel() for p in policy.parameters() if p.requires_grad),
        "reference_grown": ref.exists,
        **info,
    }

"""Step events at the step boundary: reference resets (with the optimizer-state transform and the LR
restart rule that comes with it) and adapter rank growth (with the optimizer-state migration)."""

from __future__ import annotations

from typing import Any

import torch

from prorl_bench.config import AdapterKind, LossAgg, ResetSource
from prorl_bench.models.lora import adapter_rank, grow_rank
from prorl_bench.models.rollout import Rollout, chunked_logprobs
from prorl_bench.registry import OPT_TRANSFORMS
from prorl_bench.rl.growth import migrate_optimizer
from prorl_bench.rl.opt_state import apply_opt_reset, moment_norms
from prorl_bench.run.kl_measure import mean_kl
from prorl_bench.run.lifecycle import RunState
from prorl_bench.run.phases import count_policy_forward
from prorl_bench.run.setup import RunContext, build_optimizer
from prorl_bench.run.step_signals import GrowthDecision, KLStats, ResetDecision


def reset_phase(ctx: RunContext, s: RunState, out: Any, batch: Rollout, kl: KLStats, step: int) -> ResetDecision:
    """Reference reset at the step boundary (variant C): the trigger sees the step's KL to the
    reference; a reset moves the reference weights, then the optimizer state; then the adaptive KL
    coefficient sees the step's KL (to pi_old for B)."""
    ref = s.ref
    s.resets.observe_step(step, kl.ref if ref.exists else None)
    decision = ResetDecision(s.resets.due(step) if ref.exists else None)
    if decision.happened:
        with ctx.acct.stage("reset"):
            info = _reset(ctx, s, batch, step)
        s.resets.mark_reset(step)
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


def lr_restart_warmup(o: Any, lr_warmup_steps: int) -> int | None:
    """The LR-restart rule that goes with an optimizer transform (``opt_reset`` group ``o``): the
    warm-up steps the schedule restarts with at the next step, or None (the schedule goes on). A
    transform that resets Adam's step is a fresh optimizer and comes with a fresh schedule (at least
    the run's own warm-up); any other restarts only when ``opt_reset.rewarmup_steps`` > 0."""
    if OPT_TRANSFORMS.meta(o.kind).get("step") == "reset":
        return max(lr_warmup_steps, o.rewarmup_steps)
    return o.rewarmup_steps if o.rewarmup_steps > 0 else None


def _reset(ctx: RunContext, s: RunState, batch: Rollout, step: int) -> dict[str, Any]:
    """Reset pi_ref (a copy for alpha = 1, else a polyak alpha-mix) and transform the optimizer state;
    describe it.

    The KL of the current policy to the reference is measured on this step's rollout just before
    and just after the reset (one policy and two reference forwards, charged to time/reset).
    """
    cfg, acct, banned, chunk = ctx.cfg, ctx.acct, ctx.banned, ctx.mb_size
    t, alpha, policy, ref = cfg.algo.temperature, s.resets.alpha, s.policy, s.ref
    logp = chunked_logprobs(policy, batch, t, banned, chunk)
    count_policy_forward(acct, policy, batch, backward=False)

    def kl_now() -> float:
        ref.forward_cost(acct, batch)
        lr = chunked_logprobs(ref.model, batch, t, banned, chunk)
        return float(mean_kl("k3", logp, lr, batch.completion_mask, LossAgg.token))

    kl_before = kl_now()
    m_before, v_before = moment_norms(s.optimizer)
    weights, source = _reset_source(cfg, s)
    ref.reset_to(policy, alpha, weights)
    opt_info = apply_opt_reset(s.optimizer, cfg.opt_reset)
    warmup = lr_restart_warmup(cfg.opt_reset, cfg.algo.lr_warmup_steps)
    if warmup is not None:
        s.schedule.restart(step + 1, warmup)
    if cfg.reset.restore_beta:
        s.kl_ctl.restore()
    m_after, v_after = moment_norms(s.optimizer)
    return {
        "action": "polyak" if alpha < 1.0 else "copy",
        "alpha": alpha,
        "kl_before": kl_before,
        "kl_after": kl_now(),
        **opt_info,
        "m_norm_before": m_before,
        "m_norm_after": m_after,
        "v_norm_before": v_before,
        "v_norm_after": v_after,
        "next_lr": s.schedule.lr(step + 1),
        "beta_after": s.kl_ctl.value,
        **source,
    }


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
    grown = grow_rank(models, old_rank + cfg.growth.rank_step, seed=cfg.seed * 1_000_003 + step)
    optimizer, info = migrate_optimizer(
        optimizer, grown[0], cfg.growth.migration, rebuild=lambda: build_optimizer(policy, cfg.algo)
    )
    return optimizer, {
        "old_rank": old_rank,
        "new_rank": adapter_rank(policy),
        "trainable_params_before": trainable_before,
        "trainable_params_after": sum(p.numel() for p in policy.parameters() if p.requires_grad),
        "reference_grown": ref.exists,
        **info,
    }

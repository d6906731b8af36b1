"""The step's diagnostics: its metrics row (reward, losses, KL to the reference and to pi_old,
lengths, guards, the task's and the router's figures) and the no-signal warning."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from prorl_bench.config import Config
from prorl_bench.run.kl_measure import reference_kl
from prorl_bench.run.lifecycle import RunState
from prorl_bench.run.phases import Advantages, Scored, Update
from prorl_bench.run.setup import RunContext
from prorl_bench.run.step_signals import GrowthDecision, KLStats, ResetDecision


def step_kl(
    ctx: RunContext, s: RunState, sc: Scored, logp_old: torch.Tensor, upd: Update, rows: torch.Tensor
) -> KLStats:
    """The step's KL signals, from the update's figures, by the measurement every engine shares
    (``kl_measure.reference_kl``): to the reference over the updated rows (NaN for variant B or when
    no row was trained), to pi_old, and to the base while the reference is it."""
    kl_old, mask = upd.means()["kl/old"], sc.batch.completion_mask
    if not s.ref.exists or len(rows) == 0:
        return reference_kl(ctx.kl, None, None, None, ctx.cfg.algo.loss_agg, kl_old, s.ref.is_base)
    # KL to the initial base: kl/ref while the reference is the base; once it moved (a reset, or a
    # moving strategy) it is measured at regular validation steps (validate_phase); B has no second model
    lo, lr, m = logp_old[rows], upd.ref_rows[rows], mask[rows]
    return reference_kl(ctx.kl, lo, lr, m, ctx.cfg.algo.loss_agg, kl_old, s.ref.is_base)


def metrics_row(
    ctx: RunContext,
    sc: Scored,
    adv: Advantages,
    upd: Update,
    kl: KLStats,
    reset: ResetDecision,
    growth: GrowthDecision,
    beta: float,
    step: int,
) -> dict[str, Any]:
    """The step's metrics row, built last from the phases' signals (no decision reads it)."""
    mask = sc.batch.completion_mask
    row: dict[str, Any] = {
        "step": step,
        "reward/mean": float(sc.rewards.mean()),
        "reward/std": float(sc.rewards.std()),
        "success_rate": sum(sc.success) / len(sc.success),
        **upd.means(),
        "kl/ref": kl.ref,
        "kl/ref_k1": kl.ref_k1,
        "kl/k2_ref_over_old": kl.k2_ref_over_old,
        "kl/base": kl.base,
        "kl/beta": beta,
        "lr": upd.lr,
        "update_norm": upd.update_norm,
        "response_len": float(mask.sum(-1).mean()),
        "ds/kept_frac": len(adv.rows) / len(sc.batch),
        "guard/skipped": upd.skipped,
    }
    if hasattr(ctx.task, "step_metrics"):  # a task's own per-step figures (code: failure classes)
        row.update(ctx.task.step_metrics(sc.details))
    row.update(ctx.router.metrics())  # route/labelled_frac, route/detector/{recall,precision}
    row["reset"] = int(reset.happened)
    row["growth"] = int(growth.happened)
    if growth.rank is not None:
        row["adapter/rank"] = growth.rank
    return row


NO_SIGNAL_STEPS = 10  # after this many steps of reward 0 on every sample, say so


def warn_if_no_signal(cfg: Config, history: list[dict[str, Any]], out) -> None:
    """A policy that never earns reward gives GRPO no signal (every advantage is 0): the run would
    finish "completed" having learned nothing. Say so once, on stderr and as an event."""
    if any(r["reward/mean"] != 0.0 for r in history[:NO_SIGNAL_STEPS]):
        return
    from prorl_bench.run.policies import warmup_enabled

    hint = (
        "the supervised warm-up is off (warmup.enabled=true trains a base that sometimes succeeds)"
        if not warmup_enabled(cfg)
        else "try an easier task setting, a lower warmup.target_success threshold or a stronger checkpoint"
    )
    msg = (
        f"reward was 0 on every sample of the first {NO_SIGNAL_STEPS} steps: the policy never succeeds, "
        f"so every advantage is 0 and nothing is learned; {hint}"
    )
    warnings.warn(msg, stacklevel=2)
    out.event(NO_SIGNAL_STEPS, "warning", "no_reward_signal", message=msg)

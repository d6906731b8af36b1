"""The step's diagnostics: its metrics row (reward, losses, KL to the reference and to pi_old,
lengths, guards, the task's and the router's figures) and the no-signal warning."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from prorl_bench.config import Config
from prorl_bench.rl.kl import k2_ref_over_old, kl_per_token, kl_tokens
from prorl_bench.rl.losses import aggregate, diagnostic_agg
from prorl_bench.run.lifecycle import RunState
from prorl_bench.run.phases import Advantages, Scored, Update
from prorl_bench.run.setup import RunContext


def metrics_row(
    ctx: RunContext,
    s: RunState,
    sc: Scored,
    logp_old: torch.Tensor,
    adv: Advantages,
    upd: Update,
    beta: float,
    step: int,
) -> dict[str, Any]:
    """The step's metrics row (the step-boundary phases add validation, reset and growth fields)."""
    mask, n = sc.batch.completion_mask, upd.n_mb
    row: dict[str, Any] = {
        "step": step,
        "reward/mean": float(sc.rewards.mean()),
        "reward/std": float(sc.rewards.std()),
        "success_rate": sum(sc.success) / len(sc.success),
        **{k: (float(v) / n if n else float("nan")) for k, v in upd.sums.items()},
        **_reference_kl(ctx.cfg, s.ref.exists, logp_old, upd.ref_rows, mask, adv.rows),
    }
    # KL to the initial base: kl/ref while the reference is the base; once it moved (a reset, or a
    # moving strategy) it is measured at regular validation steps (validate_phase); B has no second model
    row |= {
        "kl/base": row["kl/ref"] if s.ref.is_base else float("nan"),
        "kl/beta": beta,
        "lr": s.optimizer.param_groups[0]["lr"],
        "update_norm": upd.update_norm,
        "response_len": float(mask.sum(-1).mean()),
        "ds/kept_frac": len(adv.rows) / len(sc.batch),
        "guard/skipped": s.guard.skipped,
    }
    if hasattr(ctx.task, "step_metrics"):  # a task's own per-step figures (code: failure classes)
        row.update(ctx.task.step_metrics(sc.details))
    row.update(ctx.router.metrics())  # route/labelled_frac, route/detector/{recall,precision}
    return row


def _reference_kl(
    cfg: Config, has_ref: bool, logp_old: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor
) -> dict[str, float]:
    """KL of the behaviour policy to the reference over the updated rows (None for variant B).

    ``kl/ref`` uses the configured estimator; ``kl/ref_k1`` is the unbiased k1 estimate, comparable
    across estimators; ``kl/k2_ref_over_old`` is the ProRL v2 blog formula, a diagnostic only.
    """
    if not has_ref or len(rows) == 0:
        return {"kl/ref": float("nan"), "kl/ref_k1": float("nan"), "kl/k2_ref_over_old": float("nan")}
    k = cfg.kl_estimator
    lo, lr, m = logp_old[rows], logp_ref[rows], mask[rows]
    agg = diagnostic_agg(cfg.algo.loss_agg)
    return {
        "kl/ref": float(aggregate(kl_tokens(k, lo, lr), m, agg)),
        "kl/ref_k1": float(aggregate(kl_per_token("k1", lo, lr, k.log_ratio_clamp, k.kl_clamp), m, agg)),
        "kl/k2_ref_over_old": float(aggregate(k2_ref_over_old(lr, lo), m, agg)),
    }


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

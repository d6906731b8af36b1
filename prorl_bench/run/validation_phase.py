"""Held-out validation at the step boundary: every ``eval_every`` steps and at the end, with a
generator of its own; the KL to the base once the reference has moved; the stall triggers' input."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from prorl_bench.models.rollout import chunked_logprobs
from prorl_bench.rl.losses import diagnostic_agg
from prorl_bench.run.curve_rules import pass1
from prorl_bench.run.evaluation import correct_counts, prompts_to_write, validate
from prorl_bench.run.kl_measure import mean_kl
from prorl_bench.run.lifecycle import RunState
from prorl_bench.run.phases import Scored
from prorl_bench.run.routing import route_eval, wants_route_eval
from prorl_bench.run.setup import RunContext
from prorl_bench.run.step_signals import KLStats


def validate_phase(
    ctx: RunContext,
    s: RunState,
    out: Any,
    sc: Scored,
    logp_old: torch.Tensor,
    rows: torch.Tensor,
    kl: KLStats,
    step: int,
) -> KLStats:
    """Held-out validation every eval_every steps and at the end. Only the regular evaluations feed
    the stall triggers, ``reset.source=best``'s snapshot (and kl/base): the end-of-run one must not, or
    extending a finished run (steps 35 -> 60) would change its trajectory. Returns the step's KL
    signals with ``base`` measured when the reference has left the base."""
    cfg = ctx.cfg
    regular = step % cfg.eval_every == 0
    if regular or step == cfg.steps:
        with ctx.acct.stage("eval"):
            v = run_validation(ctx, s, out, step)
            if ctx.base_model is not None and regular and not s.ref.is_base:
                kl = replace(kl, base=_kl_to(ctx, ctx.base_model, s.policy, sc.batch, logp_old, rows))
    if regular:
        if s.best is not None:  # before this step's reset (reset_phase), which may use it
            s.best.observe(step, pass1(v), s.policy)
        s.resets.observe_validation(v[cfg.reset.metric.value])
        if s.growth is not None:
            s.growth.observe_validation(v[cfg.reset.metric.value])
    return kl


def run_validation(ctx: RunContext, s: RunState, out: Any, step: int, on_progress=None) -> dict[str, Any]:
    """Validate on the held-out set with a generator of its own (training RNG untouched); log the row
    and the samples. Gradient-routing runs (and hack tasks) add ``route/<mode>/...`` (routing.py)."""
    cfg, e, device = ctx.cfg, ctx.cfg.eval, ctx.device
    vgen = torch.Generator(device=device).manual_seed(cfg.seed * 1_000_003 + step)
    n_samples, ks = e.at(step, cfg.steps)
    # coverage classes compare per-prompt counts of equal sample sizes only (the base's are eval.at(0)'s)
    same_n = n_samples == e.at(0, cfg.steps)[0]
    v, samples = validate(
        s.policy,
        ctx.task,
        ctx.tok,
        ctx.val_problems,
        temperature=cfg.algo.temperature,
        banned=ctx.banned,
        generator=vgen,
        device=device,
        n_samples=n_samples,
        ks=ks,
        n_sample_prompts=prompts_to_write(step, cfg.steps, len(ctx.val_problems), e.n_sample_prompts),
        chunk=e.batch,
        on_progress=on_progress,
        sample=ctx.sample,
        base_correct=s.base_correct if step > 0 and same_n else None,  # coverage classes against the base
    )
    if step == 0 and len(samples) == len(ctx.val_problems):  # the base evaluation writes every prompt
        s.base_correct = correct_counts(samples)
    if wants_route_eval(ctx.task, cfg.adapter.kind.value):
        rgen = torch.Generator(device=device).manual_seed(cfg.seed * 1_000_003 + step + 500_000)
        v.update(
            route_eval(
                s.policy,
                ctx.task,
                ctx.tok,
                ctx.val_problems,
                ctx.router.detector,
                temperature=cfg.algo.temperature,
                generator=rgen,
                device=device,
                chunk=e.batch,
                sample=ctx.sample,
            )
        )
    v = {"step": step, **v}
    out.validation(v)
    out.samples(step, samples)
    s.val_rows.append(v)
    return v


@torch.no_grad()
def _kl_to(ctx: RunContext, other: torch.nn.Module, policy, batch, logp_old, rows) -> float:
    """KL of the behaviour policy to ``other`` on this step's rollout: the configured estimator and
    aggregation over the updated rows, as kl/ref is (NaN when no row was updated)."""
    if len(rows) == 0:
        return float("nan")
    cfg = ctx.cfg
    logp_other = chunked_logprobs(other, batch, cfg.algo.temperature, ctx.banned, ctx.mb_size)
    mask = batch.completion_mask[rows]
    return float(mean_kl(ctx.kl, logp_old[rows], logp_other[rows], mask, diagnostic_agg(cfg.algo.loss_agg)))

"""The phases of one RL step up to the update: rollout -> reward -> old logprobs -> advantages ->
PPO epochs x minibatches (loss, backward, optimizer step). Each phase is a function whose inputs and
outputs are visible in its signature; the small dataclasses are what flows between them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from prorl_bench.config import KLPlacement, LossAgg
from prorl_bench.models.rollout import Rollout, chunked_logprobs, token_logprobs
from prorl_bench.rl.advantages import informative_groups
from prorl_bench.rl.losses import aggregate, clipped_surrogate, diagnostic_agg
from prorl_bench.rl.optim import ParamSnapshot
from prorl_bench.run.accounting import StepAccounting
from prorl_bench.run.evaluation import completions, score_details
from prorl_bench.run.kl_measure import mean_kl
from prorl_bench.run.lifecycle import RunState
from prorl_bench.run.setup import RunContext


@dataclass
class Scored:
    """A rollout and its verdicts: ``batch`` holds prompts_per_step x group_size sequences (rows
    grouped by prompt); ``rewards`` is (prompts_per_step, group_size)."""

    problems: list[Any]
    batch: Rollout
    n_gen: int  # generated tokens
    rewards: torch.Tensor
    success: list[bool]
    details: list[Any]  # the verifier's per-sample details (code: failure classes)


@dataclass
class Advantages:
    adv: torch.Tensor  # (B,): one advantage per sequence, broadcast over its tokens
    rows: torch.Tensor  # indices of the sequences the update trains on (dynamic sampling, skipped batches)
    adv_retain: torch.Tensor | None = None  # route.advantages=split: the retain adapter's own (B,) advantages


@dataclass
class MinibatchLoss:
    """One minibatch's loss and what its diagnostics are computed from (all on ``idx``'s rows)."""

    loss: torch.Tensor
    pg: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor
    logp: torch.Tensor  # (b, L) the policy's logprobs of the sampled tokens
    clipped: torch.Tensor  # (b, L) bool: tokens whose gradient the clip removed
    mask: torch.Tensor  # (b, L) completion tokens
    logp_ref: torch.Tensor | None  # (b, L) the reference's logprobs (None without a reference)
    loss_retain: torch.Tensor | None = None  # split routing: the loss whose gradient the retain adapter takes


@dataclass
class Update:
    sums: dict[str, Any]  # UPDATE_KEYS -> sum over the optimizer steps taken (device scalars)
    n_mb: int  # optimizer steps taken
    ref_rows: torch.Tensor  # (B, L) logp_ref as the update saw it (epoch 0); NaN on rows not trained
    update_norm: float  # L2 norm of the step's parameter change
    lr: float  # the learning rate the step's optimizer steps used
    skipped: int  # minibatches the guards have skipped so far in the run

    def means(self) -> dict[str, float]:
        """UPDATE_KEYS -> mean over the optimizer steps taken (NaN when none was taken)."""
        return {k: (float(v) / self.n_mb if self.n_mb else float("nan")) for k, v in self.sums.items()}


UPDATE_KEYS = ("loss/total", "loss/pg", "loss/kl", "entropy", "clip_frac", "grad_norm", "kl/old")


def begin_step(s: RunState, step: int) -> float:
    """The step's learning rate, and the reference's own move (a moving strategy's hook). Returns
    the KL coefficient beta of this step."""
    beta = s.kl_ctl.value
    for group in s.optimizer.param_groups:
        group["lr"] = s.schedule.lr(step)
    s.ref.before_rollout(s.policy, step)
    return beta


def rollout(ctx: RunContext, s: RunState) -> tuple[list[Any], Rollout]:
    """prompts_per_step prompts x group_size samples each, KV-cached sampling at temperature T."""
    a = ctx.cfg.algo
    problems = [p for p in ctx.task.sample_train(s.rng, a.prompts_per_step) for _ in range(a.group_size)]
    prompt_ids, prompt_mask = ctx.tok.encode_prompts([p.prompt for p in problems])
    batch = ctx.sample(
        s.policy,
        ctx.tok,
        prompt_ids.to(ctx.device),
        prompt_mask.to(ctx.device),
        ctx.task.max_completion_len,
        a.temperature,
        a.top_k,
        s.sample_gen,
        top_p=a.top_p,
    )
    ctx.acct.add_flops(s.policy.flops_per_token(batch.ids.shape[1]) * batch.key_mask.sum())
    return problems, batch


def score(ctx: RunContext, problems: list[Any], batch: Rollout, step: int) -> Scored:
    """The task's verifier scores every completion; the detector labels samples (routing and its baselines)."""
    a = ctx.cfg.algo
    texts = completions(ctx.tok, batch)
    reward_list, success, details = score_details(ctx.task, texts, problems)
    rewards = torch.tensor(reward_list, device=ctx.device).view(a.prompts_per_step, a.group_size)
    ctx.router.label(step, problems, texts, details)  # this step's labels (partial oversight: routing.py)
    n_gen = int(batch.completion_mask.sum())
    return Scored(problems, batch, n_gen, rewards, success, details)


def old_logprobs(ctx: RunContext, policy: torch.nn.Module, batch: Rollout) -> torch.Tensor:
    """Behaviour (pi_old) logprobs (B, L): a no-grad teacher-forced pass, recomputed every rollout,
    chunked by the minibatch size so its shapes (and floats) equal the update's."""
    logp_old = chunked_logprobs(policy, batch, ctx.cfg.algo.temperature, ctx.banned, ctx.mb_size)
    count_policy_forward(ctx.acct, policy, batch, backward=False)
    return logp_old


def advantages(
    ctx: RunContext, s: RunState, sc: Scored, logp_old: torch.Tensor, beta: float, finite: bool, step: int
) -> Advantages:
    """Advantages from the rewards (with the KL folded in when kl_estimator.placement=reward), and
    the rows the update trains on: dynamic sampling drops all-equal groups; a non-finite rollout
    (``finite`` False, or non-finite advantages under skip_batch) trains on none."""
    shaped = ctx.router.shape_rewards(sc.rewards)  # route.use=penalize: labelled samples lose route.penalty
    shaped = _kl_in_reward(ctx, s, sc, logp_old, shaped, beta)
    adv, adv_retain = ctx.router.advantages(shaped)  # the estimator bound with its parameters (Router)
    finite = finite and s.guard.ok(adv, step, "advantages", "advantages")
    return Advantages(adv, _trained_rows(ctx, sc.rewards, finite), adv_retain)


def _kl_in_reward(
    ctx: RunContext, s: RunState, sc: Scored, logp_old: torch.Tensor, rewards: torch.Tensor, beta: float
) -> torch.Tensor:
    """``kl_estimator.placement=reward``: rewards (N, G) minus beta x the sequence's summed per-token
    KL penalty to the reference; the rewards unchanged otherwise (or at beta = 0)."""
    k = ctx.cfg.kl_estimator
    if k.placement != KLPlacement.reward or beta <= 0:
        return rewards
    logp_ref = s.ref.logp(torch.arange(len(sc.batch), device=ctx.device), sc.batch, ctx.acct)
    kl_tok = ctx.kl.reward(logp_old, logp_ref)
    return rewards - beta * (kl_tok * sc.batch.completion_mask).sum(-1).view_as(sc.rewards)


def _trained_rows(ctx: RunContext, rewards: torch.Tensor, finite: bool) -> torch.Tensor:
    """Indices (of the B sequences) the update trains on: dynamic sampling keeps informative groups
    only, a non-finite rollout (skip_batch) keeps none, and gradient routing's filter drops labelled rows."""
    a = ctx.cfg.algo
    everyone = torch.ones_like(rewards[:, 0], dtype=torch.bool)
    keep = informative_groups(rewards) if a.dynamic_sampling else everyone
    keep &= finite  # skip_batch: a non-finite rollout updates nothing
    return ctx.router.update_rows(keep.repeat_interleave(a.group_size).nonzero().squeeze(-1))  # filter drops


def ppo_update(
    ctx: RunContext, s: RunState, sc: Scored, logp_old: torch.Tensor, adv: Advantages, beta: float, step: int
) -> Update:
    """ppo_epochs x minibatches of the clipped surrogate + beta * KL, one optimizer step each."""
    a = ctx.cfg.algo
    sums: dict[str, Any] = dict.fromkeys(UPDATE_KEYS, 0.0)
    n_mb = 0
    ref_rows = torch.full_like(logp_old, float("nan"))
    trainable = [p for p in s.policy.parameters() if p.requires_grad]
    params_before = ParamSnapshot(trainable, ctx.cfg.hardware.update_norm)  # frozen ones cannot move: no copy
    for epoch in range(a.ppo_epochs if len(adv.rows) else 0):
        perm = adv.rows[torch.randperm(len(adv.rows), generator=s.shuffle_gen).to(ctx.device)]
        for idx in perm.tensor_split(min(a.minibatches, len(perm))):  # route.use=filter may leave few rows
            # autocast around the forwards and the loss only: its cache of bf16 weight casts lives until
            # the context exits, so an optimizer step inside it would leave later minibatches on the
            # weights from before the step (stale casts). Backward runs outside, as torch advises.
            with ctx.autocast:
                mb = minibatch_loss(ctx, s, sc, idx, logp_old, adv, beta)
            if epoch == 0 and mb.logp_ref is not None:
                ref_rows[idx] = mb.logp_ref
            grad_norm = optimizer_step(ctx, s, mb, trainable, step)
            if grad_norm is not None:
                n_mb += 1
                _accumulate(sums, mb, logp_old[idx], grad_norm, diagnostic_agg(a.loss_agg))
    s.guard.flush()
    # The last minibatch's gradients are read by nothing after its step; kept, they would hold one
    # parameter-sized copy on the device through the next rollout, log-prob passes and validation.
    s.optimizer.zero_grad(set_to_none=True)
    lr = s.optimizer.param_groups[0]["lr"]
    return Update(sums, n_mb, ref_rows, _update_norm(params_before, trainable), lr, s.guard.skipped)


def minibatch_loss(
    ctx: RunContext, s: RunState, sc: Scored, idx: torch.Tensor, logp_old: torch.Tensor, adv: Advantages, beta: float
) -> MinibatchLoss:
    """loss = clipped surrogate + beta * KL(anchor) - entropy_coef * entropy on the rows ``idx``,
    each aggregated by algo.loss_agg. The anchor is the reference (B: pi_old)."""
    a, k = ctx.cfg.algo, ctx.cfg.kl_estimator
    mb = sc.batch.rows(idx)
    mask = mb.completion_mask
    with ctx.router.forward(s.policy, idx):  # route.use=route: labelled rows reach only the forget adapter
        logp, entropy = token_logprobs(s.policy, mb, a.temperature, ctx.banned, with_entropy=True)
    count_policy_forward(ctx.acct, s.policy, mb, backward=True)
    with ctx.acct.stage("ref_logprob"):
        logp_ref = s.ref.logp(idx, mb, ctx.acct)  # A0: a fresh reference forward, here
    old = logp_old[idx]

    def surrogate(adv_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The aggregated clipped surrogate for these rows' (b,) advantages, and its clip mask (b, L)."""
        tok, clip = clipped_surrogate(logp, old, adv_rows, a.eps_low, a.eps_high, k.log_ratio_clamp, a.clip_ratio_c)
        return aggregate(tok, mask, a.loss_agg, ctx.loss_norm_len), clip

    pg, clipped = surrogate(adv.adv[idx])
    kl_loss = torch.zeros((), device=ctx.device)
    if ctx.kl_in_loss:  # B has no reference: its trust region is the KL to pi_old
        # old: pi_old sampled these tokens (an importance-weighted estimator needs it; others ignore it)
        kl_tok = ctx.kl(logp, s.ref.anchor(logp_ref, old), old)
        kl_loss = aggregate(kl_tok, mask, a.loss_agg, ctx.loss_norm_len)
    ent = aggregate(entropy, mask, a.loss_agg, ctx.loss_norm_len)
    loss = pg + beta * kl_loss - a.entropy_coef * ent
    loss_retain = ctx.router.retain_loss(loss, pg, surrogate, adv.adv_retain, idx)  # split routing, else None
    return MinibatchLoss(loss, pg, kl_loss, ent, logp, clipped, mask, logp_ref, loss_retain)


def optimizer_step(
    ctx: RunContext, s: RunState, mb: MinibatchLoss, trainable: list[torch.Tensor], step: int
) -> torch.Tensor | None:
    """Backward, gradient clipping, AdamW step; the guards skip (or fail) on a non-finite loss or
    gradient. Returns the pre-clip gradient norm, or None when the minibatch was skipped."""
    s.optimizer.zero_grad(set_to_none=True)
    if not s.guard.ok(mb.loss, step, "update", "loss/total"):
        return None
    ctx.router.backward(s.policy, mb.loss, mb.loss_retain)  # loss.backward(), or split routing's two gradients
    max_norm = ctx.cfg.algo.grad_clip if ctx.cfg.algo.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(s.policy.parameters(), max_norm)
    if not s.guard.ok(grad_norm, step, "update", "grad_norm"):
        s.optimizer.zero_grad(set_to_none=True)
        return None
    s.optimizer.step()
    s.guard.params_ok(trainable, step)
    return grad_norm


def _accumulate(
    sums: dict[str, Any], mb: MinibatchLoss, logp_old: torch.Tensor, grad_norm: torch.Tensor, diag: LossAgg
) -> None:
    """Add one optimizer step's figures to ``sums``, on device (one host transfer per step)."""
    clip_frac = aggregate(mb.clipped.float(), mb.mask, diag)
    kl_old = mean_kl("k3", mb.logp, logp_old, mb.mask, diag)
    for key, val in zip(UPDATE_KEYS, (mb.loss, mb.pg, mb.kl, mb.entropy, clip_frac, grad_norm, kl_old)):
        sums[key] = sums[key] + val.detach()


def _update_norm(before: ParamSnapshot, trainable: list[torch.Tensor]) -> float:
    """L2 norm of this step's parameter change (all PPO epochs/minibatches together); NaN under
    ``hardware.update_norm=off``. ``before``: the snapshot taken before the update (optim.py)."""
    return before.norm(trainable)


def count_policy_forward(acct: StepAccounting, policy: torch.nn.Module, batch, backward: bool) -> None:
    tokens = batch.key_mask.sum()  # a device scalar: StepAccounting reads it once per step (no sync here)
    fwd = tokens * policy.flops_per_token(batch.ids.shape[1])
    acct.forward("policy", tokens, fwd * (3.0 if backward else 1.0))  # backward ~ 2x forward

"""The RL training loop. ``_train`` reads as the algorithm: one step = rollout -> reward -> old
logprobs -> reference logprobs (per variant) -> advantages -> PPO epochs x minibatches -> step
boundary (validation, reset, growth) -> metrics row -> checkpoint. Each phase is a function whose
inputs and outputs are visible in its signature; the small dataclasses below are what flows between
them (``RunContext``: fixed for the run; ``RunState``: everything a checkpoint holds). Timers wrap the
phases in the loop.

Variant-specific behaviour lives in small strategy objects (``reference.py``); the math lives in
pure functions (``kl.py``, ``advantages.py``, ``losses.py``).
"""

from __future__ import annotations

import math
import random
import sys
import warnings
from contextlib import closing, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prorl_bench.config import (
    AdapterKind,
    AdapterReferenceKind,
    Config,
    ConfigError,
    Device,
    DType,
    GrowthKind,
    KLPlacement,
    LossAgg,
)
from prorl_bench.models.dual_lora import attach_dual_lora
from prorl_bench.models.lora import adapter_rank, attach_lora, grow_rank
from prorl_bench.models.rollout import Rollout, chunked_logprobs, generate, token_logprobs
from prorl_bench.registry import OPT_TRANSFORMS
from prorl_bench.rl.advantages import informative_groups
from prorl_bench.rl.growth import GrowthSchedule, migrate_optimizer
from prorl_bench.rl.kl import k2_ref_over_old, kl_per_token, kl_tokens, reward_kl_tokens
from prorl_bench.rl.kl_control import KLController
from prorl_bench.rl.losses import aggregate, clipped_surrogate, diagnostic_agg
from prorl_bench.rl.opt_state import apply_opt_reset, moment_norms
from prorl_bench.rl.optim import ParamSnapshot, build_adamw
from prorl_bench.rl.reference import AdapterReference, ReferenceContext, build_reference, frozen_copy
from prorl_bench.rl.resets import ResetSchedule
from prorl_bench.rl.schedule import LRSchedule
from prorl_bench.run.accounting import COUNTERS, STAGES, StepAccounting, measured_matmul_peak
from prorl_bench.run.checkpoint import (
    finished_summary,
    load_latest,
    rewrite_logs,
    save_checkpoint,
    truncate_logs,
)
from prorl_bench.run.evaluation import completions, correct_counts, prompts_to_write, score_details, validate
from prorl_bench.run.guards import NonFiniteGuard
from prorl_bench.run.lifecycle import RunSession, RunState
from prorl_bench.run.outputs import RESOLVED_CONFIG, atomic_write_text
from prorl_bench.run.policies import build_tokenizer, load_base_policy
from prorl_bench.run.routing import Router, route_backward, route_eval, wants_route_eval
from prorl_bench.run.rundir import RunDirLock
from prorl_bench.run.signals import Preempted, PreemptionFlag
from prorl_bench.tasks.base import make_task


def resolve_device(cfg: Config) -> torch.device:
    want = cfg.hardware.device
    if want == Device.auto:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if want == Device.cuda and not torch.cuda.is_available():
        raise ConfigError("hardware.device=cuda but no CUDA device is available; allowed here: cpu, auto")
    return torch.device(want.value)


def use_deterministic_algorithms(mode: bool) -> None:
    """``torch.use_deterministic_algorithms(mode, warn_only=True)`` without its import of
    ``torch._inductor`` (about 3 s per process, paid by every run and every sweep worker) only to set
    the compiler's flag: nothing here compiles, so unless inductor is loaded already the eager flag is
    all there is to set."""
    if "torch._inductor.config" in sys.modules or not hasattr(torch._C, "_set_deterministic_algorithms"):
        torch.use_deterministic_algorithms(mode, warn_only=True)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=True)


def setup_hardware(cfg: Config, threads: int) -> tuple[torch.device, Any]:
    """The device and the autocast context of the forward passes (bf16 only on CUDA)."""
    torch.set_num_threads(threads)
    device = resolve_device(cfg)
    use_deterministic_algorithms(cfg.hardware.deterministic)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.hardware.tf32
        torch.backends.cudnn.allow_tf32 = cfg.hardware.tf32
    bf16 = matmul_dtype(cfg, device) == torch.bfloat16
    return device, torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else nullcontext()


def matmul_dtype(cfg: Config, device: torch.device) -> torch.dtype:
    """The precision the run's matmuls use: bf16 (autocast) only on CUDA; ``auto`` on a CPU-only host
    and every CPU run: fp32."""
    return torch.bfloat16 if cfg.hardware.dtype == DType.bf16 and device.type == "cuda" else torch.float32


def seed_everything(seed: int) -> None:
    """Seed every global generator: loky reuses worker processes across sweep jobs."""
    random.seed(seed)
    torch.manual_seed(seed)


def train(
    cfg: Config,
    run_dir: Path,
    cache_root: Path,
    threads: int = 1,
    progress: bool = False,
    resolved_config: str | None = None,
    stop_file: Path | None = None,
) -> dict[str, Any]:
    """Run one experiment; write its files into ``run_dir``; return the summary dict.

    The run directory is locked for the whole run (a second process fails at once, nothing
    written). ``resolved_config`` (YAML text) is written only once the resume has been accepted, so
    a refused resume leaves the existing run's record untouched. ``stop_file``: a sweep's STOP file;
    when it appears the run stops at the next step end as if preempted.
    """
    # Signals are caught from the start: a SIGTERM during the warm-up or the setup stops the run
    # cleanly too (Preempted, nothing half-written), not only one during training.
    with RunDirLock(run_dir), closing(PreemptionFlag(stop_file)) as preempt:
        return _train(cfg, run_dir, cache_root, threads, progress, resolved_config, preempt)


@dataclass
class RunContext:
    """What a run is built from and never changes while it trains (what changes is ``RunState``)."""

    cfg: Config
    run_dir: Path
    device: torch.device
    autocast: Any  # the forward passes' autocast context (bf16 on CUDA) or a null context
    tok: Any  # CharTokenizer, or the HF checkpoint's tokenizer
    banned: tuple[int, ...]  # token ids never sampled (their logprobs are of the renormalised rest)
    task: Any
    mb_size: int  # rows per minibatch, and per chunk of the no-grad teacher-forced passes
    router: Router  # gradient routing's labels and what they do (routing.py); the identity without a detector
    base_model: torch.nn.Module | None  # a frozen snapshot of the base when the reference can move
    kl_in_loss: bool
    loss_norm_len: int  # tokens: seq_mean_token_sum_norm's fixed normaliser (the completion budget)
    peak_flops: float  # FLOP/s, for MFU
    acct: StepAccounting  # the step's timers and counters
    val_problems: list[Any]
    base_info: dict[str, Any]


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


def _train(
    cfg: Config,
    run_dir: Path,
    cache_root: Path,
    threads: int,
    progress: bool,
    resolved_config: str | None,
    preempt: PreemptionFlag,
) -> dict[str, Any]:
    """The RL loop: setup and resume, then one iteration per RL step over the named phases."""
    ctx, s = _setup(cfg, run_dir, cache_root, threads, preempt, progress)
    if (signum := preempt.stop_signal()) is not None:
        raise Preempted(0, signum, stage="setup")  # arrived while the model loaded: nothing trained yet
    ckpt = _resume(cfg, run_dir, s, resolved_config)
    if ckpt is not None and s.start > cfg.steps and (finished := finished_summary(run_dir, cfg.steps)):
        return finished  # re-running a finished run: nothing to do, nothing rewritten
    acct = ctx.acct
    with RunSession(cfg, run_dir, s, progress, preempt) as run:
        run.begin(ckpt, objective=s.ref.objective, base=ctx.base_info)
        if ckpt is None and cfg.eval.at_start:
            _validate(ctx, s, run.out, 0, run.eval_progress(0))  # the base policy: every run carries its own "before"
        for step in range(s.start, cfg.steps + 1):
            acct.reset()
            beta = begin_step(s, step)
            with acct.stage("rollout"), ctx.autocast:
                problems, batch = rollout(ctx, s)
            with acct.stage("reward"):
                sc = score(ctx, problems, batch, step)
            with acct.stage("old_logprob"), ctx.autocast:
                logp_old = old_logprobs(ctx, s.policy, batch)
            finite = s.guard.ok(logp_old, step, "old_logprob", "logp_old")
            with acct.stage("ref_logprob"), ctx.autocast:
                s.ref.prepare(batch, acct)  # A1/A2/C here once; A0 later per minibatch; B never
            adv = advantages(ctx, s, sc, logp_old, beta, finite, step)
            with acct.stage("update"):
                upd = ppo_update(ctx, s, sc, logp_old, adv, beta, step)
            row = metrics_row(ctx, s, sc, logp_old, adv, upd, beta, step)
            validate_phase(ctx, s, run.out, sc, logp_old, adv.rows, row, step)
            reset_phase(ctx, s, run.out, batch, row, step)
            grow_phase(ctx, s, run.out, row, step)
            row.update(acct.row(len(batch), sc.n_gen, ctx.peak_flops))
            run.step_done(row)
            if step == NO_SIGNAL_STEPS:
                _warn_if_no_signal(cfg, s.history, run.out)
            checkpoint_phase(ctx, s, run, step)
        return _finish(ctx, s, run)


def _setup(
    cfg: Config, run_dir: Path, cache_root: Path, threads: int, preempt: PreemptionFlag, progress: bool = False
) -> tuple[RunContext, RunState]:
    """Hardware, tokenizer, task, the base policy (cached warm-up; an HF model as loaded), and the
    fresh run state (policy with adapters, reference, optimizer, schedules, RNGs)."""
    device, autocast = setup_hardware(cfg, threads)
    seed_everything(cfg.seed)
    a = cfg.algo
    tok = build_tokenizer(cfg)
    banned = tuple(tok.banned_ids)
    task = make_task(cfg.task)
    if a.max_new_tokens is not None:  # one completion budget for every task (TRL max_completion_length)
        task.max_completion_len = a.max_new_tokens
    mb_size = a.prompts_per_step * a.group_size // a.minibatches
    router = Router(cfg, task)
    policy, base_info = load_base_policy(cfg, task, tok, device, cache_root, preempt.stop_signal, progress)
    s = _initial_state(cfg, policy, task, banned, device, mb_size)
    base_model = None  # kl/base once the reference has left the base (a reset, or a moving reference)
    if cfg.variant.resets or s.ref.moves:
        base_model = AdapterReference(policy) if uses_adapter_reference(cfg) else frozen_copy(policy)
    ctx = RunContext(
        cfg=cfg,
        run_dir=Path(run_dir),
        device=device,
        autocast=autocast,
        tok=tok,
        banned=banned,
        task=task,
        mb_size=mb_size,
        router=router,
        base_model=base_model,
        kl_in_loss=cfg.kl_estimator.placement == KLPlacement.loss and a.beta > 0,
        loss_norm_len=task.max_completion_len,
        peak_flops=cfg.hardware.peak_flops or measured_matmul_peak(device, matmul_dtype(cfg, device)),
        acct=StepAccounting(device),
        val_problems=task.val_set(),
        base_info=base_info,
    )
    return ctx, s


# --------------------------------------------------------------------------- the phases of one step


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
    batch = generate(
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
    _count_policy_forward(ctx.acct, policy, batch, backward=False)
    return logp_old


def advantages(
    ctx: RunContext, s: RunState, sc: Scored, logp_old: torch.Tensor, beta: float, finite: bool, step: int
) -> Advantages:
    """Advantages from the rewards (with the KL folded in when kl_estimator.placement=reward), and
    the rows the update trains on: dynamic sampling drops all-equal groups; a non-finite rollout
    (``finite`` False, or non-finite advantages under skip_batch) trains on none."""
    a, k = ctx.cfg.algo, ctx.cfg.kl_estimator
    shaped = ctx.router.shape_rewards(sc.rewards)  # route.use=penalize: labelled samples lose route.penalty
    if k.placement == KLPlacement.reward and beta > 0:
        logp_ref = s.ref.logp(torch.arange(len(sc.batch), device=ctx.device), sc.batch, ctx.acct)
        kl_tok = reward_kl_tokens(k, logp_old, logp_ref)
        shaped = shaped - beta * (kl_tok * sc.batch.completion_mask).sum(-1).view_as(sc.rewards)
    adv, adv_retain = ctx.router.advantages(a.advantage, shaped, a.adv_eps, a.advantage_params)
    finite = finite and s.guard.ok(adv, step, "advantages", "advantages")
    everyone = torch.ones_like(sc.rewards[:, 0], dtype=torch.bool)
    keep = informative_groups(sc.rewards) if a.dynamic_sampling else everyone
    keep &= finite  # skip_batch: a non-finite rollout updates nothing
    rows = ctx.router.update_rows(keep.repeat_interleave(a.group_size).nonzero().squeeze(-1))  # filter drops
    return Advantages(adv, rows, adv_retain)


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
    return Update(sums, n_mb, ref_rows, _update_norm(params_before, trainable))


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
    _count_policy_forward(ctx.acct, s.policy, mb, backward=True)
    with ctx.acct.stage("ref_logprob"):
        logp_ref = s.ref.logp(idx, mb, ctx.acct)  # A0: a fresh reference forward, here
    old = logp_old[idx]
    pg_tok, clipped = clipped_surrogate(
        logp, old, adv.adv[idx], a.eps_low, a.eps_high, k.log_ratio_clamp, a.clip_ratio_c
    )
    pg = aggregate(pg_tok, mask, a.loss_agg, ctx.loss_norm_len)
    kl_loss = torch.zeros((), device=ctx.device)
    if ctx.kl_in_loss:  # B has no reference: its trust region is the KL to pi_old
        kl_loss = aggregate(kl_tokens(k, logp, s.ref.anchor(logp_ref, old)), mask, a.loss_agg, ctx.loss_norm_len)
    ent = aggregate(entropy, mask, a.loss_agg, ctx.loss_norm_len)
    loss = pg + beta * kl_loss - a.entropy_coef * ent
    loss_retain = None
    if adv.adv_retain is not None:  # split routing: the retain adapter's gradient comes from its own advantages
        pg_retain_tok, _ = clipped_surrogate(
            logp, old, adv.adv_retain[idx], a.eps_low, a.eps_high, k.log_ratio_clamp, a.clip_ratio_c
        )
        loss_retain = loss - pg + aggregate(pg_retain_tok, mask, a.loss_agg, ctx.loss_norm_len)
    return MinibatchLoss(loss, pg, kl_loss, ent, logp, clipped, mask, logp_ref, loss_retain)


def optimizer_step(
    ctx: RunContext, s: RunState, mb: MinibatchLoss, trainable: list[torch.Tensor], step: int
) -> torch.Tensor | None:
    """Backward, gradient clipping, AdamW step; the guards skip (or fail) on a non-finite loss or
    gradient. Returns the pre-clip gradient norm, or None when the minibatch was skipped."""
    s.optimizer.zero_grad(set_to_none=True)
    if not s.guard.ok(mb.loss, step, "update", "loss/total"):
        return None
    route_backward(s.policy, mb.loss, mb.loss_retain)  # loss.backward(), or split routing's two gradients
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
    kl_old = aggregate(kl_per_token("k3", mb.logp, logp_old), mb.mask, diag)
    for key, val in zip(UPDATE_KEYS, (mb.loss, mb.pg, mb.kl, mb.entropy, clip_frac, grad_norm, kl_old)):
        sums[key] = sums[key] + val.detach()


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


def validate_phase(
    ctx: RunContext,
    s: RunState,
    out: Any,
    sc: Scored,
    logp_old: torch.Tensor,
    rows: torch.Tensor,
    row: dict[str, Any],
    step: int,
) -> None:
    """Held-out validation every eval_every steps and at the end. Only the regular evaluations feed
    the stall triggers (and kl/base): the end-of-run one must not, or extending a finished run
    (steps 35 -> 60) would change its trajectory."""
    cfg = ctx.cfg
    regular = step % cfg.eval_every == 0
    if regular or step == cfg.steps:
        with ctx.acct.stage("eval"):
            v = _validate(ctx, s, out, step)
            if ctx.base_model is not None and regular and not s.ref.is_base:
                row["kl/base"] = _kl_to(ctx, ctx.base_model, s.policy, sc.batch, logp_old, rows)
    if regular:
        s.resets.observe_validation(v[cfg.reset.metric.value])
        if s.growth is not None:
            s.growth.observe_validation(v[cfg.reset.metric.value])


def reset_phase(ctx: RunContext, s: RunState, out: Any, batch: Rollout, row: dict[str, Any], step: int) -> None:
    """Reference reset at the step boundary (variant C): the reference weights, then the optimizer
    state; then the adaptive KL coefficient sees the step's KL."""
    ref = s.ref
    s.resets.observe_step(step, row["kl/ref"] if ref.exists else None)
    reason = s.resets.due(step) if ref.exists else None
    row["reset"] = int(reason is not None)
    if reason is not None:
        with ctx.acct.stage("reset"):
            info = _reset(ctx, s, batch, step)
        s.resets.mark_reset(step)
        out.event(step, "reset", reason, **info)
    s.kl_ctl.update(row["kl/ref"] if ref.exists else row["kl/old"])


def grow_phase(ctx: RunContext, s: RunState, out: Any, row: dict[str, Any], step: int) -> None:
    """Topology growth: the adapter rank grows, the optimizer state is migrated by index."""
    why = s.growth.due(step, adapter_rank(s.policy), bool(row["reset"])) if s.growth is not None else None
    row["growth"] = int(why is not None)
    if why is not None:
        with ctx.acct.stage("growth"):
            s.optimizer, info = _grow(ctx.cfg, step, s.policy, s.ref, s.optimizer)
        out.event(step, "growth", why, **info)
    if ctx.cfg.adapter.kind == AdapterKind.lora:
        row["adapter/rank"] = adapter_rank(s.policy)


def checkpoint_phase(ctx: RunContext, s: RunState, run: RunSession, step: int) -> None:
    """Checkpoint periodically, at the end, and at once when a preemption signal arrived (then stop)."""
    cfg = ctx.cfg
    every = cfg.checkpoint.every
    if run.preempt.requested or (every and step % every == 0) or step == cfg.steps:
        save_checkpoint(ctx.run_dir, step, s.state_dict(cfg, run.wall()), cfg.checkpoint.keep_last)
    run.stop_if_preempted(
        step, lambda: summarize(cfg, s.history, s.val_rows, s.ref.objective, ctx.base_info, run.wall())
    )


def _finish(ctx: RunContext, s: RunState, run: RunSession) -> dict[str, Any]:
    """The completed run's summary (written by the session), with an export when asked for."""
    cfg = ctx.cfg
    summary = summarize(cfg, s.history, s.val_rows, s.ref.objective, ctx.base_info, run.wall())
    reset_at = [r["step"] for r in s.history if r["reset"]]
    summary.update({"resets": len(reset_at), "reset_steps": reset_at, **memory_figures(s.ref.model, ctx.device)})
    if cfg.export.at_end:
        summary["export"] = _export(s.policy, cfg, ctx.tok, ctx.run_dir)
    run.finish(summary)
    return summary


def _validate(ctx: RunContext, s: RunState, out: Any, step: int, on_progress=None) -> dict[str, Any]:
    """Validate on the held-out set with a generator of its own (training RNG untouched); log the row
    and the samples. Gradient-routing runs (and hack tasks) add ``route/<mode>/...`` (routing.py)."""
    cfg, e, device = ctx.cfg, ctx.cfg.eval, ctx.device
    vgen = torch.Generator(device=device).manual_seed(cfg.seed * 1_000_003 + step)
    v, samples = validate(
        s.policy,
        ctx.task,
        ctx.tok,
        ctx.val_problems,
        temperature=cfg.algo.temperature,
        banned=ctx.banned,
        generator=vgen,
        device=device,
        n_samples=e.n_samples,
        ks=e.ks,
        n_sample_prompts=prompts_to_write(step, cfg.steps, len(ctx.val_problems), e.n_sample_prompts),
        chunk=e.batch,
        on_progress=on_progress,
        base_correct=s.base_correct if step > 0 else None,  # coverage classes against the base
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
            )
        )
    v = {"step": step, **v}
    out.validation(v)
    out.samples(step, samples)
    s.val_rows.append(v)
    return v


def _export(policy, cfg: Config, tok, run_dir: Path) -> str:
    from prorl_bench.cli.export import export_policy  # transformers / safetensors only when exporting

    return str(export_policy(policy, cfg, tok, Path(run_dir) / "export"))


def _resume(cfg: Config, run_dir: Path, s: RunState, resolved_config: str | None) -> dict[str, Any] | None:
    """Continue from the newest checkpoint of ``run_dir``, if any (returned); put the logs in step
    with the state. Every step appears exactly once: metrics and validation rows are rewritten from
    the checkpoint's history (rows lost after they were written come back); other logs are cut back
    to its step. ``config_resolved.yaml`` is written only now, once the resume was accepted. A
    finished run is left untouched (the caller returns its summary)."""
    ckpt = load_latest(run_dir, cfg)
    if ckpt is not None:
        s.load_state_dict(ckpt, lambda p: build_optimizer(p, cfg.algo))
        if s.start > cfg.steps and finished_summary(run_dir, cfg.steps) is not None:
            return ckpt
    truncate_logs(run_dir, s.start - 1 if ckpt is not None else -1)
    if ckpt is not None:
        rewrite_logs(run_dir, s.history, s.val_rows)
    if resolved_config is not None:
        atomic_write_text(run_dir / RESOLVED_CONFIG, resolved_config)
    return ckpt


UPDATE_KEYS = ("loss/total", "loss/pg", "loss/kl", "entropy", "clip_frac", "grad_norm", "kl/old")


def _initial_state(cfg: Config, policy, task, banned: tuple[int, ...], device: torch.device, mb_size: int) -> RunState:
    """A fresh run's state: the policy (with adapters), the variant's reference, the optimizer, the
    schedules and triggers, and the three RNGs (prompts, token sampling, minibatch order)."""
    a = cfg.algo
    seed_everything(cfg.seed)  # the base may have been trained in this process: reseed after it
    d = cfg.adapter
    if d.kind == AdapterKind.lora:
        attach_lora(policy, list(d.targets), d.rank, d.alpha, d.freeze_base)
    elif d.kind == AdapterKind.dual_lora:  # gradient routing: retain + forget adapters
        attach_dual_lora(policy, list(d.targets), d.retain_rank, d.forget_rank, d.alpha, d.freeze_base)
    policy.train()
    ref_ctx = ReferenceContext(
        policy=policy,
        temperature=a.temperature,
        banned=banned,
        chunk=mb_size,
        max_batch=a.prompts_per_step * a.group_size,
        max_len=task.max_completion_len,
        device=device,
        adapter_reference=uses_adapter_reference(cfg),
    )
    ref = build_reference(cfg.variant.reference, ref_ctx, cfg.variant.params)
    optimizer = build_optimizer(policy, a)
    growth = GrowthSchedule(cfg.growth, cfg.reset.metric) if cfg.growth.kind != GrowthKind.none else None
    return RunState(
        policy=policy,
        ref=ref,
        optimizer=optimizer,
        schedule=LRSchedule(a.lr, a.lr_warmup_steps),
        kl_ctl=KLController(a.beta, cfg.kl_ctl),
        resets=ResetSchedule(cfg.reset),
        growth=growth,
        guard=NonFiniteGuard(cfg.guard.nonfinite, device),
        rng=random.Random(cfg.seed),
        sample_gen=torch.Generator(device=device).manual_seed(cfg.seed),
        shuffle_gen=torch.Generator().manual_seed(cfg.seed),
    )


NO_SIGNAL_STEPS = 10  # after this many steps of reward 0 on every sample, say so


def _warn_if_no_signal(cfg: Config, history: list[dict[str, Any]], out) -> None:
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


@torch.no_grad()
def _kl_to(ctx: RunContext, other: torch.nn.Module, policy, batch, logp_old, rows) -> float:
    """KL of the behaviour policy to ``other`` on this step's rollout: the configured estimator and
    aggregation over the updated rows, as kl/ref is (NaN when no row was updated)."""
    if len(rows) == 0:
        return float("nan")
    cfg = ctx.cfg
    logp_other = chunked_logprobs(other, batch, cfg.algo.temperature, ctx.banned, ctx.mb_size)
    kl_tok = kl_tokens(cfg.kl_estimator, logp_old[rows], logp_other[rows])
    return float(aggregate(kl_tok, batch.completion_mask[rows], diagnostic_agg(cfg.algo.loss_agg)))


def _reset(ctx: RunContext, s: RunState, batch: Rollout, step: int) -> dict[str, Any]:
    """Reset pi_ref (a copy for alpha = 1, else a polyak alpha-mix) and transform the optimizer state;
    describe it.

    The KL of the current policy to the reference is measured on this step's rollout just before
    and just after the reset (one policy and two reference forwards, charged to time/reset).
    """
    cfg, acct, banned, chunk = ctx.cfg, ctx.acct, ctx.banned, ctx.mb_size
    t, alpha, policy, ref = cfg.algo.temperature, s.resets.alpha, s.policy, s.ref
    logp = chunked_logprobs(policy, batch, t, banned, chunk)
    _count_policy_forward(acct, policy, batch, backward=False)

    def kl_now() -> float:
        ref.forward_cost(acct, batch)
        lr = chunked_logprobs(ref.model, batch, t, banned, chunk)
        return float(aggregate(kl_per_token("k3", logp, lr), batch.completion_mask, LossAgg.token))

    kl_before = kl_now()
    m_before, v_before = moment_norms(s.optimizer)
    ref.reset_to(policy, alpha)
    opt_info = apply_opt_reset(s.optimizer, cfg.opt_reset)
    o = cfg.opt_reset
    if OPT_TRANSFORMS.meta(o.kind).get("step") == "reset":  # a fresh optimizer comes with a fresh LR schedule
        s.schedule.restart(step + 1, max(cfg.algo.lr_warmup_steps, o.rewarmup_steps))
    elif o.rewarmup_steps > 0:
        s.schedule.restart(step + 1, o.rewarmup_steps)
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
    }


def uses_adapter_reference(cfg: Config) -> bool:
    """True when the reference is the frozen base + its own adapters (no deep copy of the policy)."""
    d = cfg.adapter
    if d.kind != AdapterKind.lora:
        return False
    return d.reference == AdapterReferenceKind.adapters or (d.reference == AdapterReferenceKind.auto and d.freeze_base)


def build_optimizer(policy: torch.nn.Module, a) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (adapters only when the base is frozen); fused on CUDA,
    foreach on CPU (``algo.adamw_impl``; optim.py says why)."""
    return build_adamw([p for p in policy.parameters() if p.requires_grad], a)


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


def _update_norm(before: ParamSnapshot, trainable: list[torch.Tensor]) -> float:
    """L2 norm of this step's parameter change (all PPO epochs/minibatches together); NaN under
    ``hardware.update_norm=off``. ``before``: the snapshot taken before the update (optim.py)."""
    return before.norm(trainable)


def _count_policy_forward(acct: StepAccounting, policy: torch.nn.Module, batch, backward: bool) -> None:
    tokens = batch.key_mask.sum()  # a device scalar: StepAccounting reads it once per step (no sync here)
    fwd = tokens * policy.flops_per_token(batch.ids.shape[1])
    acct.forward("policy", tokens, fwd * (3.0 if backward else 1.0))  # backward ~ 2x forward


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


def summarize(
    cfg: Config,
    history: list[dict[str, Any]],
    val_rows: list[dict[str, Any]],
    objective: str,
    base_info: dict[str, Any],
    wall: float,
) -> dict[str, Any]:
    """Final and aggregate figures of a completed run (the head/tail are 10% of the steps)."""
    n = len(history)
    k = max(1, n // 10)

    def mean(key: str, rows: list[dict[str, Any]]) -> float:
        vals = [r[key] for r in rows if r.get(key) is not None and not math.isnan(r[key])]
        return sum(vals) / len(vals) if vals else float("nan")

    totals = {
        key: sum(r[key] for r in history)
        for key in (*COUNTERS, *(f"time/{s}" for s in STAGES), "time/step", "perf/flops")
    }
    step_time = totals["time/step"]
    return {
        "status": "completed",
        "error": None,
        "variant": cfg.variant.name,
        "objective": objective,
        "steps_completed": n,
        "wall_time_s": wall,
        "success_rate/first10": mean("success_rate", history[:k]),
        "success_rate/last10": mean("success_rate", history[-k:]),
        "reward/first10": mean("reward/mean", history[:k]),
        "reward/last10": mean("reward/mean", history[-k:]),
        "kl/ref_mean": mean("kl/ref", history),
        "kl/ref_max": max((r["kl/ref"] for r in history if not math.isnan(r["kl/ref"])), default=float("nan")),
        "final_val": val_rows[-1] if val_rows else None,
        "totals": totals,
        "time/step_mean": step_time / n,
        "time/ref_share": totals["time/ref_logprob"] / step_time if step_time else 0.0,
        "throughput/steps_per_s": n / step_time,
        "throughput/samples_per_s": n * cfg.algo.prompts_per_step * cfg.algo.group_size / step_time,
        "perf/flops_per_s": totals["perf/flops"] / step_time,
        "base": base_info,
    }


def memory_figures(reference: torch.nn.Module | None, device: torch.device) -> dict[str, float]:
    """``mem/reference_mb``: bytes the reference model holds itself (0 for B; the adapter copies for
    an adapter reference); ``mem/peak_rss_mb``: the process's peak resident memory (ru_maxrss — in a
    sweep worker that ran several jobs, the peak of all of them); ``mem/cuda_max_allocated_mb`` on GPU."""
    import resource

    held = 0 if reference is None else sum(t.numel() * t.element_size() for t in reference.state_dict().values())
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    out = {"mem/reference_mb": held / 2**20, "mem/peak_rss_mb": peak_rss}
    if device.type == "cuda":
        out["mem/cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out

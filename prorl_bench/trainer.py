"""The RL training loop. Reads top to bottom: one step = rollout -> reward -> old logprobs ->
reference logprobs (per variant) -> advantages -> PPO epochs x minibatches -> log.

Variant-specific behaviour lives in small strategy objects (``reference.py``); the math lives in
pure functions (``kl.py``, ``advantages.py``, ``losses.py``).
"""

from __future__ import annotations

import math
import random
import warnings
from contextlib import closing, nullcontext
from pathlib import Path
from typing import Any

import torch

from prorl_bench.accounting import COUNTERS, STAGES, StepAccounting, measured_matmul_peak
from prorl_bench.advantages import informative_groups
from prorl_bench.checkpoint import (
    finished_summary,
    load_latest,
    rewrite_logs,
    save_checkpoint,
    truncate_logs,
)
from prorl_bench.config import (
    AdapterKind,
    AdapterReferenceKind,
    Config,
    ConfigError,
    Device,
    DType,
    GrowthKind,
    K2Mode,
    KLPlacement,
    LossAgg,
)
from prorl_bench.dual_lora import attach_dual_lora
from prorl_bench.evaluation import completions, score_details, validate
from prorl_bench.growth import GrowthSchedule, migrate_optimizer
from prorl_bench.guards import NonFiniteGuard, Preempted, PreemptionFlag
from prorl_bench.kl import k2_ref_over_old, kl_per_token
from prorl_bench.kl_control import KLController
from prorl_bench.lifecycle import RunSession, RunState
from prorl_bench.lora import adapter_rank, attach_lora, grow_rank
from prorl_bench.losses import aggregate, clipped_surrogate, diagnostic_agg
from prorl_bench.opt_state import apply_opt_reset, moment_norms
from prorl_bench.outputs import RESOLVED_CONFIG, atomic_write_text
from prorl_bench.policies import build_tokenizer, load_base_policy
from prorl_bench.reference import AdapterReference, build_reference, frozen_copy
from prorl_bench.registry import OPT_TRANSFORMS
from prorl_bench.resets import ResetSchedule, reset_reference
from prorl_bench.rollout import chunked_logprobs, generate, token_logprobs
from prorl_bench.routing import Router, route_backward, route_eval, wants_route_eval
from prorl_bench.rundir import RunDirLock
from prorl_bench.schedule import LRSchedule
from prorl_bench.tasks import make_task


def resolve_device(cfg: Config) -> torch.device:
    want = cfg.hardware.device
    if want == Device.auto:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if want == Device.cuda and not torch.cuda.is_available():
        raise ConfigError("hardware.device=cuda but no CUDA device is available; allowed here: cpu, auto")
    return torch.device(want.value)


def setup_hardware(cfg: Config, threads: int) -> tuple[torch.device, Any]:
    """The device and the autocast context of the forward passes (bf16 only on CUDA)."""
    torch.set_num_threads(threads)
    device = resolve_device(cfg)
    torch.use_deterministic_algorithms(cfg.hardware.deterministic, warn_only=True)
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


def _train(
    cfg: Config, run_dir: Path, cache_root: Path, threads: int, progress: bool, resolved_config: str | None,
    preempt: PreemptionFlag,
):  # fmt: skip
    device, autocast = setup_hardware(cfg, threads)
    seed_everything(cfg.seed)
    a, kl_cfg = cfg.algo, cfg.kl_estimator
    tok = build_tokenizer(cfg)  # CharTokenizer, or the HF checkpoint's tokenizer
    banned = tuple(tok.banned_ids)
    task = make_task(cfg.task)
    if a.max_new_tokens is not None:  # one completion budget for every task (TRL max_completion_length)
        task.max_completion_len = a.max_new_tokens
    batch_size = a.prompts_per_step * a.group_size
    mb_size = batch_size // a.minibatches
    router = Router(cfg, task)  # a detector's labels and what they do (routing.py); identity without one
    detector = router.detector

    # -- the base policy (cached warm-up; an HF model as loaded), its reference and everything resumable
    policy, base_info = load_base_policy(cfg, task, tok, device, cache_root, stop=preempt.stop_signal)
    s = _initial_state(cfg, policy, task, banned, device, mb_size)
    ref = s.ref
    base_model = None  # C: a frozen snapshot of the base, for kl/base once the reference has moved
    if cfg.variant.resets:
        base_model = AdapterReference(policy) if uses_adapter_reference(cfg) else frozen_copy(policy)
    kl_in_loss = kl_cfg.placement == KLPlacement.loss and a.beta > 0
    peak = cfg.hardware.peak_flops or measured_matmul_peak(device, matmul_dtype(cfg, device))
    acct = StepAccounting(device)
    val_problems = task.val_set()

    # -- resume: continue from the newest checkpoint of this run directory, if there is one
    if (signum := preempt.stop_signal()) is not None:
        raise Preempted(0, signum, stage="setup")  # arrived while the model loaded: nothing trained yet
    ckpt = _resume(cfg, run_dir, s, resolved_config)
    if ckpt is not None and s.start > cfg.steps and (finished := finished_summary(run_dir, cfg.steps)):
        return finished  # re-running a finished run: nothing to do, nothing rewritten

    with RunSession(cfg, run_dir, s, progress, preempt) as run:
        out = run.out
        run.begin(ckpt, objective=ref.objective, base=base_info)

        def run_validation(step: int) -> dict[str, Any]:
            return _validate(cfg, step, policy, task, tok, val_problems, banned, device, out, s.val_rows, detector)

        if ckpt is None and cfg.eval.at_start:
            run_validation(0)  # the base policy: every run carries its own "before" (not a trigger signal)

        for step in range(s.start, cfg.steps + 1):
            acct.reset()
            beta = s.kl_ctl.value
            for group in s.optimizer.param_groups:
                group["lr"] = s.schedule.lr(step)

            # 1. rollout: prompts_per_step prompts x group_size samples, KV-cached sampling
            with acct.stage("rollout"), autocast:
                problems = [p for p in task.sample_train(s.rng, a.prompts_per_step) for _ in range(a.group_size)]
                prompt_ids, prompt_mask = tok.encode_prompts([p.prompt for p in problems])
                batch = generate(
                    policy, tok, prompt_ids.to(device), prompt_mask.to(device), task.max_completion_len,
                    a.temperature, a.top_k, s.sample_gen, top_p=a.top_p,
                )  # fmt: skip
                mask = batch.completion_mask
                n_gen = int(mask.sum())
                acct.add_flops(policy.flops_per_token(batch.ids.shape[1]) * batch.key_mask.sum())

            # 2. reward: the task's verifier
            with acct.stage("reward"):
                texts = completions(tok, batch)
                reward_list, success_list, details = score_details(task, texts, problems)
                rewards = torch.tensor(reward_list, device=device).view(a.prompts_per_step, a.group_size)
                router.label(step, problems, texts, details)  # gradient routing / its baselines: this step's labels

            # 3. behaviour (old-policy) logprobs: a no-grad teacher-forced pass, recomputed every rollout
            with acct.stage("old_logprob"), autocast:
                logp_old = chunked_logprobs(policy, batch, a.temperature, banned, mb_size)
                _count_policy_forward(acct, policy, batch, backward=False)
            finite = s.guard.ok(logp_old, step, "old_logprob", "logp_old")

            # 4. reference logprobs (a per-rollout cache): A1/A2/C here once; A0 later per minibatch; B never
            with acct.stage("ref_logprob"), autocast:
                ref.prepare(batch, acct)

            # 5. advantages, with the KL optionally folded into the reward, and dynamic sampling
            shaped = router.shape_rewards(rewards)  # penalize: labelled samples lose route.penalty
            if kl_cfg.placement == KLPlacement.reward and beta > 0:
                logp_ref_all = ref.logp(torch.arange(len(batch), device=device), batch, acct)
                if kl_cfg.name == "k2" and kl_cfg.k2_mode == K2Mode.ref_over_old:
                    kl_tok = k2_ref_over_old(logp_ref_all, logp_old)
                else:
                    kl_tok = kl_per_token(kl_cfg.name, logp_old, logp_ref_all, kl_cfg.log_ratio_clamp, kl_cfg.kl_clamp)
                shaped = shaped - beta * (kl_tok * mask).sum(-1).view_as(rewards)
            adv, adv_retain = router.advantages(a.advantage, shaped, a.adv_eps)  # adv_retain: split routing only
            finite = finite and s.guard.ok(adv, step, "advantages", "advantages")
            everyone = torch.ones_like(rewards[:, 0], dtype=torch.bool)
            keep = informative_groups(rewards) if a.dynamic_sampling else everyone
            keep &= finite  # skip_batch: a non-finite rollout updates nothing
            rows = router.update_rows(keep.repeat_interleave(a.group_size).nonzero().squeeze(-1))  # filter drops

            # 6. update: ppo_epochs x minibatches of clipped surrogate + beta * KL
            sums: dict[str, Any] = dict.fromkeys(UPDATE_KEYS, 0.0)
            n_mb = 0
            diag_agg = diagnostic_agg(a.loss_agg)
            ref_rows = torch.full_like(logp_old, float("nan"))  # logp_ref as the update saw it (epoch 0)
            trainable = [p for p in policy.parameters() if p.requires_grad]
            params_before = [p.detach().clone() for p in trainable]  # frozen ones cannot move: no copy of them
            with acct.stage("update"):
                for epoch in range(a.ppo_epochs if len(rows) else 0):
                    perm = rows[torch.randperm(len(rows), generator=s.shuffle_gen).to(device)]
                    for idx in perm.tensor_split(min(a.minibatches, len(perm))):  # filter may leave few rows
                        # autocast around the forwards and the loss only: its cache of bf16 weight casts lives
                        # until the context exits, so an optimizer step inside it would leave later minibatches
                        # on the weights from before the step (stale casts). Backward runs outside, as torch advises.
                        with autocast:
                            mb = batch.rows(idx)
                            mb_mask = mb.completion_mask
                            with router.forward(policy, idx):
                                logp, entropy = token_logprobs(policy, mb, a.temperature, banned, with_entropy=True)
                            _count_policy_forward(acct, policy, mb, backward=True)
                            with acct.stage("ref_logprob"):
                                logp_ref = ref.logp(idx, mb, acct)  # A0: a fresh reference forward, here
                            if epoch == 0 and logp_ref is not None:
                                ref_rows[idx] = logp_ref
                            pg_tok, clipped = clipped_surrogate(
                                logp, logp_old[idx], adv[idx], a.eps_low, a.eps_high, kl_cfg.log_ratio_clamp,
                                a.clip_ratio_c,
                            )  # fmt: skip
                            pg = aggregate(pg_tok, mb_mask, a.loss_agg)
                            if adv_retain is not None:  # split routing: the retain adapter's own advantages
                                pg_retain = aggregate(clipped_surrogate(
                                    logp, logp_old[idx], adv_retain[idx], a.eps_low, a.eps_high, kl_cfg.log_ratio_clamp,
                                    a.clip_ratio_c,
                                )[0], mb_mask, a.loss_agg)  # fmt: skip
                            kl_loss = torch.zeros((), device=device)
                            if kl_in_loss:  # B has no reference: its trust region is the KL to pi_old
                                anchor = ref.anchor(logp_ref, logp_old[idx])
                                kl_tok = kl_per_token(
                                    kl_cfg.name, logp, anchor, kl_cfg.log_ratio_clamp, kl_cfg.kl_clamp
                                )
                                kl_loss = aggregate(kl_tok, mb_mask, a.loss_agg)
                            ent = aggregate(entropy, mb_mask, a.loss_agg)
                            loss = pg + beta * kl_loss - a.entropy_coef * ent
                        s.optimizer.zero_grad(set_to_none=True)
                        if not s.guard.ok(loss, step, "update", "loss/total"):
                            continue
                        route_backward(policy, loss, None if adv_retain is None else loss - pg + pg_retain)
                        max_norm = a.grad_clip if a.grad_clip > 0 else float("inf")
                        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm)
                        if not s.guard.ok(grad_norm, step, "update", "grad_norm"):
                            s.optimizer.zero_grad(set_to_none=True)
                            continue
                        s.optimizer.step()
                        s.guard.params_ok(trainable, step)
                        n_mb += 1
                        # accumulate on device; one host transfer per step (no syncs inside the loop)
                        clip_frac = aggregate(clipped.float(), mb_mask, diag_agg)
                        kl_old = aggregate(kl_per_token("k3", logp, logp_old[idx]), mb_mask, diag_agg)
                        for key, val in zip(UPDATE_KEYS, (loss, pg, kl_loss, ent, clip_frac, grad_norm, kl_old)):
                            sums[key] = sums[key] + val.detach()

            s.guard.flush()
            row: dict[str, Any] = {
                "step": step, "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()),
                "success_rate": sum(success_list) / len(success_list),
                **{k: (float(v) / n_mb if n_mb else float("nan")) for k, v in sums.items()},
                **_reference_kl(cfg, ref.exists, logp_old, ref_rows, mask, rows),
            }  # fmt: skip
            # KL to the initial base: the reference itself until a reset moves it (A0/A1/A2 never reset);
            # after C's first reset it is measured at regular validation steps; B keeps no second model
            reference_is_base = ref.exists and not any(r["reset"] for r in s.history)
            row |= {
                "kl/base": row["kl/ref"] if reference_is_base else float("nan"), "kl/beta": beta,
                "lr": s.optimizer.param_groups[0]["lr"], "update_norm": _update_norm(params_before, trainable),
                "response_len": float(mask.sum(-1).mean()), "ds/kept_frac": len(rows) / len(batch),
                "guard/skipped": s.guard.skipped,
            }  # fmt: skip
            if hasattr(task, "step_metrics"):  # a task's own per-step figures (code: failure classes)
                row.update(task.step_metrics(details))
            row.update(router.metrics())  # route/labelled_frac, route/detector/{recall,precision}

            # 7. held-out validation every eval_every steps and at the end. Only the regular evaluations
            # feed the stall trigger (and C's kl/base): the end-of-run one must not, or extending a
            # finished run (steps 35 -> 60) would change its trajectory.
            regular = step % cfg.eval_every == 0
            if regular or step == cfg.steps:
                with acct.stage("eval"):
                    v = run_validation(step)
                    if base_model is not None and regular and not reference_is_base:
                        row["kl/base"] = _kl_to(cfg, base_model, policy, batch, logp_old, rows, banned, mb_size)
            if regular:
                s.resets.observe_validation(v[cfg.reset.metric.value])
                if s.growth is not None:
                    s.growth.observe_validation(v[cfg.reset.metric.value])

            # 8. reference reset at the step boundary (variant C): the reference weights, then the optimizer state
            s.resets.observe_step(step, row["kl/ref"] if ref.exists else None)
            reason = s.resets.due(step) if ref.exists else None
            row["reset"] = int(reason is not None)
            if reason is not None:
                with acct.stage("reset"):
                    info = _reset(cfg, step, s, batch, acct, banned, mb_size)
                s.resets.mark_reset(step)
                out.event(step, "reset", reason, **info)
            s.kl_ctl.update(row["kl/ref"] if ref.exists else row["kl/old"])

            # 9. topology growth: the adapter rank grows, the optimizer state is migrated
            why = s.growth.due(step, adapter_rank(policy), bool(row["reset"])) if s.growth is not None else None
            row["growth"] = int(why is not None)
            if why is not None:
                with acct.stage("growth"):
                    s.optimizer, info = _grow(cfg, step, policy, ref, s.optimizer)
                out.event(step, "growth", why, **info)
            if cfg.adapter.kind == AdapterKind.lora:
                row["adapter/rank"] = adapter_rank(policy)

            # 10. log one metrics row
            row.update(acct.row(len(batch), n_gen, peak))
            run.step_done(row)
            if step == NO_SIGNAL_STEPS:
                _warn_if_no_signal(cfg, s.history, out)

            # 11. checkpoint: periodically, and at once when a preemption signal arrived
            every = cfg.checkpoint.every
            if run.preempt.requested or (every and step % every == 0) or step == cfg.steps:
                save_checkpoint(run_dir, step, s.state_dict(cfg, run.wall()), cfg.checkpoint.keep_last)
            run.stop_if_preempted(
                step, lambda: summarize(cfg, s.history, s.val_rows, ref.objective, base_info, run.wall())
            )

        summary = summarize(cfg, s.history, s.val_rows, ref.objective, base_info, run.wall())
        reset_at = [r["step"] for r in s.history if r["reset"]]
        summary.update({"resets": len(reset_at), "reset_steps": reset_at, **memory_figures(ref.model, device)})
        if cfg.export.at_end:
            summary["export"] = _export(policy, cfg, tok, run_dir)
        run.finish(summary)
    return summary


def _validate(cfg, step, policy, task, tok, val_problems, banned, device, out, val_rows, detector) -> dict[str, Any]:
    """Validate on the held-out set with a generator of its own (training RNG untouched); log the row
    and the samples. Gradient-routing runs (and hack tasks) add ``route/<mode>/...`` (routing.py)."""
    vgen = torch.Generator(device=device).manual_seed(cfg.seed * 1_000_003 + step)
    e = cfg.eval
    v, samples = validate(
        policy, task, tok, val_problems, temperature=cfg.algo.temperature, banned=banned, generator=vgen,
        device=device, n_samples=e.n_samples, ks=e.ks, n_sample_prompts=e.n_sample_prompts, chunk=e.batch,
    )  # fmt: skip
    if wants_route_eval(task, cfg.adapter.kind.value):
        rgen = torch.Generator(device=device).manual_seed(cfg.seed * 1_000_003 + step + 500_000)
        v.update(route_eval(policy, task, tok, val_problems, detector, temperature=cfg.algo.temperature,
                            generator=rgen, device=device, chunk=e.batch))  # fmt: skip
    v = {"step": step, **v}
    out.validation(v)
    out.samples(step, samples)
    val_rows.append(v)
    return v


def _export(policy, cfg: Config, tok, run_dir: Path) -> str:
    from prorl_bench.export import export_policy  # transformers / safetensors only when exporting

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
    ref = build_reference(
        cfg.variant.reference, policy, temperature=a.temperature, banned=banned, chunk=mb_size,
        max_batch=a.prompts_per_step * a.group_size, max_len=task.max_completion_len, device=device,
        adapter_reference=uses_adapter_reference(cfg),
    )  # fmt: skip
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
    from prorl_bench.policies import warmup_enabled

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
def _kl_to(cfg: Config, other: torch.nn.Module, policy, batch, logp_old, rows, banned, chunk) -> float:
    """KL of the behaviour policy to ``other`` on this step's rollout: the configured estimator and
    aggregation over the updated rows, as kl/ref is (NaN when no row was updated)."""
    if len(rows) == 0:
        return float("nan")
    logp_other = chunked_logprobs(other, batch, cfg.algo.temperature, banned, chunk)
    k = cfg.kl_estimator
    kl_tok = kl_per_token(k.name, logp_old[rows], logp_other[rows], k.log_ratio_clamp, k.kl_clamp)
    return float(aggregate(kl_tok, batch.completion_mask[rows], diagnostic_agg(cfg.algo.loss_agg)))


def _reset(cfg: Config, step: int, s: RunState, batch, acct, banned, chunk) -> dict[str, Any]:
    """Reset pi_ref (a copy for alpha = 1, else a polyak alpha-mix) and transform the optimizer state;
    describe it.

    The KL of the current policy to the reference is measured on this step's rollout just before
    and just after the reset (one policy and two reference forwards, charged to time/reset).
    """
    t, alpha, policy, ref = cfg.algo.temperature, s.resets.alpha, s.policy, s.ref
    logp = chunked_logprobs(policy, batch, t, banned, chunk)
    _count_policy_forward(acct, policy, batch, backward=False)

    def kl_now() -> float:
        ref.forward_cost(acct, batch)
        lr = chunked_logprobs(ref.model, batch, t, banned, chunk)
        return float(aggregate(kl_per_token("k3", logp, lr), batch.completion_mask, LossAgg.token))

    kl_before = kl_now()
    m_before, v_before = moment_norms(s.optimizer)
    reset_reference(ref.model, policy, alpha)
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
    """AdamW over the trainable parameters (adapters only when the base is frozen).

    ``foreach=True``: the multi-tensor implementation also on CPU (torch picks it only on CUDA);
    one fused loop over ~40 small tensors instead of a Python loop per tensor.
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    return torch.optim.AdamW(
        params,
        lr=a.lr,
        betas=(a.adam_beta1, a.adam_beta2),
        eps=a.adam_eps,
        weight_decay=a.weight_decay,
        foreach=True,
    )


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


def _update_norm(before: list[torch.Tensor], trainable: list[torch.Tensor]) -> float:
    """L2 norm of this step's parameter change (all PPO epochs/minibatches together).

    ``before``: copies of the ``trainable`` parameters from before the update. One host transfer for
    all tensors (a GPU sync per tensor otherwise); the per-tensor sums are added in order on the host.
    """
    if not trainable:
        return 0.0
    per_tensor = torch.stack([(p.detach() - b).double().square().sum() for b, p in zip(before, trainable)])
    return sum(per_tensor.tolist()) ** 0.5


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
        "kl/ref": float(aggregate(kl_per_token(k.name, lo, lr, k.log_ratio_clamp, k.kl_clamp), m, agg)),
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

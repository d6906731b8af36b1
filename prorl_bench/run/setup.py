"""State construction: what a run is built from (``RunContext``, fixed while it trains) and its fresh
``RunState`` (policy with adapters, reference, optimizer, schedules, triggers, RNGs); the resume from
the newest checkpoint."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prorl_bench.config import AdapterKind, AdapterReferenceKind, Config, GrowthKind, KLPlacement, ResetSource
from prorl_bench.models.dual_lora import attach_dual_lora
from prorl_bench.models.lora import attach_lora
from prorl_bench.rl.best import BestPolicy
from prorl_bench.rl.growth import GrowthSchedule
from prorl_bench.rl.kl import KLEstimator, build_kl
from prorl_bench.rl.kl_control import KLController
from prorl_bench.rl.optim import build_adamw
from prorl_bench.rl.reference import AdapterReference, ReferenceContext, build_reference, frozen_copy
from prorl_bench.rl.resets import ResetSchedule
from prorl_bench.rl.schedule import LRSchedule
from prorl_bench.run.accounting import StepAccounting, measured_matmul_peak
from prorl_bench.run.checkpoint import finished_summary, load_latest, rewrite_logs, truncate_logs
from prorl_bench.run.guards import NonFiniteGuard
from prorl_bench.run.hardware import matmul_dtype, seed_everything, setup_hardware
from prorl_bench.run.lifecycle import RunState
from prorl_bench.run.outputs import RESOLVED_CONFIG, atomic_write_text
from prorl_bench.run.policies import build_tokenizer, load_base_policy
from prorl_bench.run.routing import Router
from prorl_bench.run.sampler import SAMPLER, Sampler
from prorl_bench.run.signals import PreemptionFlag
from prorl_bench.tasks.base import make_task


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
    sample: Sampler  # rollout.generate, or what the caller injected (run/sampler.py: a population's barrier)
    router: Router  # gradient routing's labels and what they do (routing.py); the identity without a detector
    kl: KLEstimator  # the configured KL estimator, its parameters bound once (kl.py)
    base_model: torch.nn.Module | None  # a frozen snapshot of the base when the reference can move
    kl_in_loss: bool
    loss_norm_len: int  # tokens: seq_mean_token_sum_norm's fixed normaliser (the completion budget)
    peak_flops: float  # FLOP/s, for MFU
    acct: StepAccounting  # the step's timers and counters
    val_problems: list[Any]
    base_info: dict[str, Any]


def setup_run(
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
    s = initial_state(cfg, policy, task, banned, device, mb_size)
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
        sample=SAMPLER.get(),
        router=router,
        kl=build_kl(cfg.kl_estimator),
        base_model=base_model,
        kl_in_loss=cfg.kl_estimator.placement == KLPlacement.loss and a.beta > 0,
        loss_norm_len=task.max_completion_len,
        peak_flops=cfg.hardware.peak_flops or measured_matmul_peak(device, matmul_dtype(cfg, device)),
        acct=StepAccounting(device),
        val_problems=task.val_set(),
        base_info=base_info,
    )
    return ctx, s


def initial_state(cfg: Config, policy, task, banned: tuple[int, ...], device: torch.device, mb_size: int) -> RunState:
    """A fresh run's state: the policy (with adapters), the variant's reference, the optimizer, the
    schedules and triggers, and the three RNGs (prompts, token sampling, minibatch order)."""
    a = cfg.algo
    seed_everything(cfg.seed)  # the base may have been trained in this process: reseed after it
    d = cfg.adapter.params  # LoraParams / DualLoraParams (None for adapter=none)
    if cfg.adapter.kind == AdapterKind.lora:
        attach_lora(policy, list(d.targets), d.rank, d.alpha, d.freeze_base)
    elif cfg.adapter.kind == AdapterKind.dual_lora:  # gradient routing: retain + forget adapters
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
    ref = build_reference(cfg.variant.reference, ref_ctx, cfg.variant.params)  # its parameters bound once
    optimizer = build_optimizer(policy, a)
    growth = GrowthSchedule(cfg.growth.params, cfg.reset.metric) if cfg.growth.kind != GrowthKind.none else None
    keeps_best = cfg.reset.source == ResetSource.best and cfg.reset.trigger != "none"
    return RunState(
        policy=policy,
        ref=ref,
        optimizer=optimizer,
        schedule=LRSchedule(a.lr, a.lr_warmup_steps),
        kl_ctl=KLController(a.beta, cfg.kl_ctl.params),
        resets=ResetSchedule(cfg.reset),
        growth=growth,
        guard=NonFiniteGuard(cfg.guard.nonfinite, device),
        rng=random.Random(cfg.seed),
        sample_gen=torch.Generator(device=device).manual_seed(cfg.seed),
        shuffle_gen=torch.Generator().manual_seed(cfg.seed),
        best=BestPolicy() if keeps_best else None,
    )


def uses_adapter_reference(cfg: Config) -> bool:
    """True when the reference is the frozen base + its own adapters (no deep copy of the policy)."""
    if cfg.adapter.kind != AdapterKind.lora:
        return False
    d = cfg.adapter.params
    return d.reference == AdapterReferenceKind.adapters or (d.reference == AdapterReferenceKind.auto and d.freeze_base)


def build_optimizer(policy: torch.nn.Module, a) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (adapters only when the base is frozen); fused on CUDA,
    foreach on CPU (``algo.adamw_impl``; optim.py says why)."""
    return build_adamw([p for p in policy.parameters() if p.requires_grad], a)


def resume(cfg: Config, run_dir: Path, s: RunState, resolved_config: str | None) -> dict[str, Any] | None:
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

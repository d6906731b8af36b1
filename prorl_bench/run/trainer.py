"""The RL training loop. ``_train`` reads as the algorithm: one step = rollout -> reward -> old
logprobs -> reference logprobs (per variant) -> advantages -> PPO epochs x minibatches -> step
boundary (validation, reset, growth) -> metrics row -> checkpoint. Timers wrap the phases in the loop.

Where each part lives (one concept per module): ``hardware`` (device, precision, seeding), ``setup``
(``RunContext``: fixed for the run; the fresh ``RunState``: everything a checkpoint holds; resume),
``phases`` (rollout to optimizer step, and the dataclasses that flow between them),
``validation_phase`` (held-out validation at the step boundary), ``step_events`` (resets, growth),
``diagnostics`` (the metrics row) and ``summary`` (the completed run's figures).

Variant-specific behaviour lives in small strategy objects (``rl/reference.py``); the math lives in
pure functions (``rl/kl.py``, ``rl/advantages.py``, ``rl/losses.py``).
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

from prorl_bench.config import Config
from prorl_bench.run.checkpoint import finished_summary, save_checkpoint
from prorl_bench.run.diagnostics import NO_SIGNAL_STEPS, metrics_row, step_kl, warn_if_no_signal
from prorl_bench.run.lifecycle import RunSession, RunState
from prorl_bench.run.memory import RSS_KEY, rss_mb
from prorl_bench.run.phases import advantages, begin_step, old_logprobs, ppo_update, rollout, score
from prorl_bench.run.rundir import RunDirLock
from prorl_bench.run.setup import RunContext, resume, setup_run
from prorl_bench.run.signals import Preempted, PreemptionFlag
from prorl_bench.run.step_events import grow_phase, reset_phase
from prorl_bench.run.summary import memory_figures, summarize
from prorl_bench.run.validation_phase import run_validation, validate_phase


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
    cfg: Config,
    run_dir: Path,
    cache_root: Path,
    threads: int,
    progress: bool,
    resolved_config: str | None,
    preempt: PreemptionFlag,
) -> dict[str, Any]:
    """The RL loop: setup and resume, then one iteration per RL step over the named phases."""
    ctx, s = setup_run(cfg, run_dir, cache_root, threads, preempt, progress)
    if (signum := preempt.stop_signal()) is not None:
        raise Preempted(0, signum, stage="setup")  # arrived while the model loaded: nothing trained yet
    ckpt = resume(cfg, run_dir, s, resolved_config)
    if ckpt is not None and s.start > cfg.steps and (finished := finished_summary(run_dir, cfg.steps)):
        return finished  # re-running a finished run: nothing to do, nothing rewritten
    acct = ctx.acct
    with RunSession(cfg, run_dir, s, progress, preempt) as run:
        run.begin(ckpt, objective=s.ref.objective, base=ctx.base_info)
        if ckpt is None and cfg.eval.at_start:
            run_validation(
                ctx, s, run.out, 0, run.eval_progress(0)
            )  # the base policy: every run carries its own "before"
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
            kl = step_kl(ctx, s, sc, logp_old, upd, adv.rows)
            kl = validate_phase(ctx, s, run.out, sc, logp_old, adv.rows, kl, step)
            reset = reset_phase(ctx, s, run.out, batch, kl, step)
            growth = grow_phase(ctx, s, run.out, reset, step)
            row = metrics_row(ctx, sc, adv, upd, kl, reset, growth, beta, step)  # built last, read by no decision
            row.update(acct.row(len(batch), sc.n_gen, ctx.peak_flops))
            row[RSS_KEY] = rss_mb()  # after the step: a leak shows in the run's own rows (run/memory.py)
            run.step_done(row)
            if step == NO_SIGNAL_STEPS:
                warn_if_no_signal(cfg, s.history, run.out)
            checkpoint_phase(ctx, s, run, step)
        return _finish(ctx, s, run)


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


def _export(policy, cfg: Config, tok, run_dir: Path) -> str:
    from prorl_bench.run.export import export_policy  # transformers / safetensors only when exporting

    return str(export_policy(policy, cfg, tok, Path(run_dir) / "export"))

"""The run's plumbing, fenced off from the RL step (trainer.py keeps the algorithm).

* ``RunState`` holds everything a checkpoint holds — weights, optimizer, schedules, triggers, RNGs,
  the metric history — with one ``state_dict`` / ``load_state_dict`` pair, so saving and resuming
  cannot drift apart.
* ``RunSession`` is a context manager that owns the side effects of a running run: the output
  writers and the progress bar, and it reports preemptions. Whatever happens inside (a finished
  run, a preemption, an exception), leaving it closes them (try/finally). The preemption signal
  handlers are installed earlier, for the whole of ``trainer.train`` (warm-up included), and
  restored when it returns — a sweep worker that ran a failed job keeps no stale handler or file.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from prorl_bench.config import Config
from prorl_bench.models.lora import adapter_rank, grow_rank, lora_layers
from prorl_bench.rl.best import BestPolicy
from prorl_bench.rl.growth import GrowthSchedule
from prorl_bench.rl.kl_control import KLController
from prorl_bench.rl.reference import Reference
from prorl_bench.rl.resets import ResetSchedule
from prorl_bench.rl.schedule import LRSchedule
from prorl_bench.run.checkpoint import config_dict, restore_rng, rng_state
from prorl_bench.run.guards import NonFiniteGuard
from prorl_bench.run.signals import Preempted, PreemptionFlag
from prorl_bench.run.sinks import RunWriter, open_writer


@dataclass
class RunState:
    """Everything that must survive a preemption. ``start`` is the next step to run."""

    policy: torch.nn.Module
    ref: Reference
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    kl_ctl: KLController
    resets: ResetSchedule
    growth: GrowthSchedule | None
    guard: NonFiniteGuard
    rng: random.Random  # prompts
    sample_gen: torch.Generator  # token sampling
    shuffle_gen: torch.Generator  # minibatch permutation
    best: BestPolicy | None = None  # reset.source=best: the best held-out policy so far
    history: list[dict[str, Any]] = field(default_factory=list)  # one metrics row per step
    val_rows: list[dict[str, Any]] = field(default_factory=list)  # one row per evaluation
    base_correct: list[int] | None = None  # correct samples per held-out prompt at the base evaluation (coverage)
    wall_before: float = 0.0  # seconds spent in earlier segments of this run
    start: int = 1

    def state_dict(self, cfg: Config, wall: float) -> dict[str, Any]:
        """The checkpoint payload (plain tensors and containers: loadable with weights_only=True)."""
        return {
            "config": config_dict(cfg),
            "policy": self.policy.state_dict(),
            "reference": self.ref.state_dict(),
            "reference_moved": self.ref.moved,  # kl/base: is the reference still the initial base?
            "optimizer": self.optimizer.state_dict(),
            "schedule": (self.schedule.start, self.schedule.warmup),
            "kl_ctl": self.kl_ctl.state_dict(),
            "resets": self.resets.state_dict(),
            "growth": None if self.growth is None else self.growth.state_dict(),
            "adapter_rank": _rank(self.policy),
            "rng": rng_state(self.rng, self.sample_gen, self.shuffle_gen),
            "history": self.history,
            "val_rows": self.val_rows,
            "base_correct": self.base_correct,
            "best": None if self.best is None else self.best.state_dict(),
            "skipped": self.guard.skipped,
            "wall_time_s": wall,
        }

    def load_state_dict(self, ckpt: dict[str, Any], rebuild_optimizer) -> None:
        """Restore from a checkpoint. A grown adapter is grown first (the shapes must match); the
        optimizer is rebuilt on the (possibly new) parameters before its state is loaded."""
        if ckpt["adapter_rank"] > _rank(self.policy):
            grow_rank([self.policy, *self.ref.models()], ckpt["adapter_rank"], seed=0)
        self.policy.load_state_dict(ckpt["policy"])
        # checkpoints from before "reference_moved" existed: only a reset could move the reference
        moved = ckpt.get("reference_moved", any(r["reset"] for r in ckpt["history"]))
        self.ref.load_state_dict(ckpt["reference"], moved=moved)
        self.optimizer = rebuild_optimizer(self.policy)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.schedule.start, self.schedule.warmup = ckpt["schedule"]
        self.kl_ctl.load_state_dict(ckpt["kl_ctl"])
        self.resets.load_state_dict(ckpt["resets"])
        if self.best is not None:  # the config (reset.source) matched the checkpoint's, so it holds one
            self.best.load_state_dict(ckpt["best"], next(self.policy.parameters()).device)
        if self.growth is not None:
            self.growth.load_state_dict(ckpt["growth"])
        restore_rng(ckpt["rng"], self.rng, self.sample_gen, self.shuffle_gen)
        self.history, self.val_rows, self.guard.skipped = ckpt["history"], ckpt["val_rows"], ckpt["skipped"]
        self.base_correct = ckpt.get("base_correct")  # older checkpoints: no coverage classes after resume
        self.wall_before = ckpt.get("wall_time_s", 0.0)
        self.start = ckpt["step"] + 1


class RunSession:
    """Writers, signal handlers and the progress bar of one run segment; closed on any exit.

    ``wall()`` is the run's total wall time so far (earlier segments included).
    """

    def __init__(self, cfg: Config, run_dir: Path, state: RunState, progress: bool, preempt: PreemptionFlag) -> None:
        self.cfg, self.run_dir, self.state = cfg, Path(run_dir), state
        self.preempt = preempt  # installed by the caller, before the warm-up; closed by it
        self._progress = progress
        self._t0 = time.perf_counter()
        self.out: RunWriter | None = None
        self.bar = None

    def __enter__(self) -> RunSession:
        self.out = open_writer(self.cfg, self.run_dir)  # JSONL files (+ TensorBoard / W&B when on)
        if self._progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.cfg.steps, initial=self.state.start - 1, desc="prorl-bench", unit="step",
                dynamic_ncols=True, mininterval=1.0,
            )  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.bar is not None:
                self.bar.close()
        finally:
            if self.out is not None:
                self.out.close()

    def begin(self, ckpt: dict[str, Any] | None, objective: str, base: dict[str, Any]) -> None:
        """The run's first event: ``start`` (fresh) or ``resume`` (from ``ckpt``); task=code adds the sandbox
        isolation in force on this machine (``sandbox``: full | netns+pidns | rlimits)."""
        extra = {}
        if self.cfg.task.name == "code":
            from prorl_bench.tasks.sandbox import isolation_level

            extra["sandbox"] = isolation_level()
        if ckpt is None:
            params = sum(p.numel() for p in self.state.policy.parameters())
            self.out.event(0, "start", "run", variant=self.cfg.variant.name, objective=objective, base=base,
                           params=params, **extra)  # fmt: skip
        else:
            self.out.event(ckpt["step"], "resume", f"from checkpoint at step {ckpt['step']}", **extra)

    def wall(self) -> float:
        return self.state.wall_before + time.perf_counter() - self._t0

    def step_done(self, row: dict[str, Any]) -> None:
        """Log one metrics row and advance the progress bar."""
        self.out.metrics(row)
        self.state.history.append(row)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(
                reward=f"{row['reward/mean']:.3f}",
                kl=_fmt(row["kl/ref"]),
                ref_share=f"{row['time/ref_share']:.1%}",
                rss=f"{row.get('mem/rss_mb', float('nan')):.0f}MB",
                refresh=False,
            )

    def eval_progress(self, step: int) -> Callable[[int, int], None] | None:
        """A callback for ``evaluation.validate`` that shows the evaluation of ``step`` in the bar's
        postfix (at step 0 the bar would otherwise sit at 0/N for the whole base evaluation); None
        without a bar."""
        if self.bar is None:
            return None
        bar = self.bar

        def show(done: int, total: int) -> None:
            bar.set_postfix_str(f"evaluating step {step}: {done}/{total} sequences", refresh=True)

        return show

    def stop_if_preempted(self, step: int, summarize: Callable[[], dict[str, Any]]) -> None:
        """After the checkpoint of ``step``: on a preemption signal, record it and raise Preempted."""
        if not self.preempt.requested or step >= self.cfg.steps:
            return
        summary = summarize()
        summary["status"] = "preempted"
        self.out.event(step, "preempted", signal.Signals(self.preempt.signum).name)
        self.out.summary(summary)
        raise Preempted(step, self.preempt.signum)

    def finish(self, summary: dict[str, Any]) -> None:
        self.out.event(self.cfg.steps, "end", "completed")
        self.out.summary(summary)


def _rank(policy: torch.nn.Module) -> int:
    """The LoRA rank, 0 without adapters."""
    return adapter_rank(policy) if lora_layers(policy) else 0


def _fmt(x: float | None) -> str:
    import math

    return "-" if x is None or math.isnan(x) else f"{x:.4f}"

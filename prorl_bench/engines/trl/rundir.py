"""The bench's run directory written from inside TRL's trainer: a ``TrainerCallback`` at every RL-step
boundary (one TRL log per generation batch) that

* translates TRL's logged averages into one ``metrics.jsonl`` row under the bench's key names
  (``TRL_KEYS``; what TRL does not measure is NaN, never a guess), with the verifier's success rate,
  the reference's forward calls / tokens / time counted by hooks on TRL's reference model;
* runs the bench's own held-out evaluation (pass@k, ``samples.jsonl``) every ``eval_every`` steps
  and at the end, and feeds it to the stall trigger;
* drives ``ReferenceResetCallback`` (events.jsonl ``reset`` rows);
* asks TRL to checkpoint on the bench's schedule and on a preemption signal, and saves the bench's own
  state (history, trigger, reference weights) into TRL's checkpoint directory (``BENCH_STATE``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from prorl_bench.config import Config
from prorl_bench.engines.trl.build import RewardLog
from prorl_bench.engines.trl.callback import ReferenceResetCallback, unwrap
from prorl_bench.engines.trl.meters import StepMeter
from prorl_bench.rl.kl import build_kl
from prorl_bench.run.checkpoint import config_dict, save_verified
from prorl_bench.run.diagnostics import NO_SIGNAL_STEPS, warn_if_no_signal
from prorl_bench.run.evaluation import correct_counts, prompts_to_write, validate
from prorl_bench.run.kl_measure import reference_kl
from prorl_bench.run.memory import RSS_KEY, rss_mb
from prorl_bench.run.outputs import COUNTERS, STAGES
from prorl_bench.run.step_signals import KLStats

BENCH_STATE = "prorl_bench_state.pt"  # in TRL's checkpoint-N directory, next to its optimizer.pt
# bench key <- TRL's logged key (averaged by TRL over the RL step's optimizer steps). Not kl/ref: TRL's
# logged ``kl`` is k3 of the policy being updated; the bench measures native's (``BenchRunCallback.step_kl``)
TRL_KEYS = {
    "loss/total": "loss",
    "entropy": "entropy",
    "clip_frac": "clip_ratio/region_mean",
    "grad_norm": "grad_norm",
    "lr": "learning_rate",
    "response_len": "completions/mean_length",
}
NAN = float("nan")


def gather(xs: list[Any]) -> list[Any]:
    """``xs`` of every process, rank order (one process: ``xs``). on_log runs on every process at the
    same step, so the collective is matched."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return xs
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, xs)
    return [x for part in parts for x in part]


class RefCounter:
    """Forward calls, tokens and seconds of TRL's reference model (hooks; the step's totals)."""

    def __init__(self, model: torch.nn.Module | None) -> None:
        self.calls, self.tokens, self.seconds, self._t0 = 0, 0, 0.0, 0.0
        if model is not None:
            model.register_forward_pre_hook(self._pre, with_kwargs=True)
            model.register_forward_hook(self._post)

    def _pre(self, module, args, kwargs):
        mask = kwargs.get("attention_mask")
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.calls += 1
        self.tokens += int(mask.sum()) if mask is not None else int(ids.numel())
        self._t0 = time.perf_counter()

    def _post(self, module, args, output):
        self.seconds += time.perf_counter() - self._t0

    def take(self) -> tuple[int, int, float]:
        out = (self.calls, self.tokens, self.seconds)
        self.calls, self.tokens, self.seconds = 0, 0, 0.0
        return out


class BenchRunCallback(TrainerCallback):
    """Writes the bench's run directory from TRL's training loop (see the module docstring).

    ``out``: the bench's RunWriter; ``resets``: the ReferenceResetCallback (also the LR factor);
    ``policy_view``: the trained model behind the bench's policy interface (for the evaluation);
    ``eval_kw``: what ``evaluation.validate`` needs besides the policy."""

    def __init__(self, cfg: Config, trainer: Any, out: Any, resets: ReferenceResetCallback, rewards: RewardLog,
                 policy_view: Any, eval_kw: dict[str, Any], preempt: Any, state: dict[str, Any]) -> None:  # fmt: skip
        self.cfg, self.trainer, self.out, self.resets, self.rewards = cfg, trainer, out, resets, rewards
        self.policy_view, self.eval_kw, self.preempt = policy_view, eval_kw, preempt
        self.history: list[dict[str, Any]] = state["history"]
        self.val_rows: list[dict[str, Any]] = state["val_rows"]
        self.wall_before: float = state.get("wall_time_s", 0.0)
        # the base evaluation's correct samples per held-out prompt: later evaluations' coverage classes
        self.base_correct: list[int] | None = state.get("base_correct")
        self.per = resets.per_rl_step
        self.ref = RefCounter(unwrap(trainer.ref_model, "module") if trainer.ref_model is not None else None)
        self.preempted_at: int | None = None
        self._done = (0, 0)
        self._t0 = self._mark = time.perf_counter()
        self.meter = StepMeter(trainer.model, self.per, cfg.hardware.update_norm)
        self.kl = build_kl(cfg.kl_estimator)  # the run's estimator, bound once (as native's ctx.kl)

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self._t0

    def on_step_begin(self, args, state, control, **kw):
        self.meter.on_step_begin(args, state, control, **kw)

    def on_step_end(self, args, state, control, **kw):
        self.meter.on_step_end(args, state, control, **kw)

    def on_train_begin(self, args, state, control, **kw):
        self.resets.bind(optimizer=kw.get("optimizer"), lr_scheduler=kw.get("lr_scheduler"))
        self.resets.wrap_lr()
        self._mark = time.perf_counter()

    def on_log(self, args, state, control, logs=None, **kw):
        """The RL-step boundary, in native's order: the step's measurements and typed KL signals, the
        held-out evaluation, the reset decision (the shared sequence, reading ``KLStats``), and the
        metrics row built last from them — no decision reads the row."""
        if not logs or "reward" not in logs or state.global_step % self.per:
            return  # TRL's end-of-training summary log, or not an RL-step boundary
        step = state.global_step // self.per
        step_time = time.perf_counter() - self._mark
        measured = self.measure(step, logs)
        kl = self.step_kl(step, measured)
        eval_s = self.validate_phase(step)
        t = time.perf_counter()
        info = self.resets.rl_step_end(step, kl=kl.ref)  # as native: the typed KL (NaN: none measured)
        reset_s = time.perf_counter() - t if info else 0.0
        if info is not None:
            reason = info.pop("reason")
            self.out.event(step, "reset", reason, **info)
        # as native, an RL step's time includes its evaluation and its reset
        row = self.metrics_row(step, logs, measured, kl, step_time + eval_s + reset_s)
        row |= {"time/eval": eval_s, "time/reset": reset_s, "reset": int(info is not None)}
        self.out.metrics(row)
        self.history.append(row)
        if step == NO_SIGNAL_STEPS:  # as native: a run that never earns reward learns nothing; say so
            warn_if_no_signal(self.cfg, self.history, self.out)
        every = self.cfg.checkpoint.every
        if (every and step % every == 0) or step == self.cfg.steps:
            control.should_save = True
        if self.preempt.requested and step < self.cfg.steps:
            control.should_save, control.should_training_stop = True, True
            self.preempted_at = step
        self._mark = time.perf_counter()

    def measure(self, step: int, logs: dict[str, Any]) -> dict[str, Any]:
        """The RL step's measurements (every meter's ``take``), the non-finite guard first."""
        for bench, key in (("loss/total", "loss"), ("grad_norm", "grad_norm")):
            v = float(logs.get(key, NAN))
            if not math.isfinite(v):
                raise FloatingPointError(f"step {step}: {bench}={v} (guard.nonfinite=fail; TRL's {key})")
        rewards, success, lengths = (gather(x) for x in self.rewards.take())  # every process's share
        update_norm, opt_s = self.meter.take()
        return {"rewards": rewards, "success": success, "lengths": lengths, "ref": self.ref.take(),
                "trainer": self.trainer.take_step(), "update_norm": update_norm, "opt_s": opt_s}  # fmt: skip

    def step_kl(self, step: int, measured: dict[str, Any]) -> KLStats:
        """The step's typed KL signals by native's measurement (``kl_measure.reference_kl``) on the
        log-probs TRL's loss used (``BenchGRPOTrainer``: ``kl_rows``), every process's rows."""
        taken = measured["trainer"]
        rows = taken["kl_rows"].gathered(gather).tensors()
        lo, lr, m = rows if rows is not None else (None, None, None)
        is_base = (step == 1 or not self.resets.resets) and self.trainer.ref_source != "old"
        return reference_kl(self.kl, lo, lr, m, self.cfg.algo.loss_agg, taken["kl/old"], is_base)

    def metrics_row(self, step: int, logs: dict[str, Any], measured: dict[str, Any], kl: KLStats,
                    step_time: float) -> dict[str, Any]:  # fmt: skip
        """The step's metrics row under the bench's keys, built last from the measurements and signals."""
        rewards, success, lengths = measured["rewards"], measured["success"], measured["lengths"]
        calls, tokens, ref_s = measured["ref"]
        taken = measured["trainer"]  # BenchGRPOTrainer's stage seconds and kl/old
        r = torch.tensor(rewards, dtype=torch.float64)
        row: dict[str, Any] = {
            "step": step,
            "reward/mean": float(r.mean()) if len(r) else NAN,
            "reward/std": float(r.std()) if len(r) > 1 else NAN,
            "success_rate": sum(success) / len(success) if success else NAN,
        }
        for key, trl_key in TRL_KEYS.items():
            v = logs.get(trl_key)
            row[key] = float(v) if v is not None else NAN
        a = self.cfg.algo
        # TRL's loss is the policy-gradient term alone when it adds no KL and no entropy term
        pg = row["loss/total"] if a.beta == 0 and a.entropy_coef == 0 else NAN
        row |= {"loss/pg": pg, "loss/kl": NAN, "kl/ref": kl.ref, "kl/old": kl.old, "kl/ref_k1": kl.ref_k1,
                "kl/k2_ref_over_old": kl.k2_ref_over_old, "kl/base": kl.base, "kl/beta": a.beta,
                "update_norm": measured["update_norm"], "ds/kept_frac": 1.0, "guard/skipped": 0,
                "growth": 0}  # fmt: skip
        row |= {f"time/{s}": NAN for s in STAGES}
        ref_s = ref_s if calls else 0.0
        # as native, stages nest exclusively: A0's reference forwards in the loss are ref_logprob's, not update's
        update_s = measured["opt_s"] - taken["score"] - taken["ref_in_loss"]
        row |= {"time/rollout": taken["rollout"], "time/reward": taken["reward"],
                "time/old_logprob": taken["old_logprob"], "time/ref_logprob": ref_s, "time/update": update_s,
                "time/eval": 0.0, "time/reset": 0.0, "time/growth": 0.0, "time/step": step_time}  # fmt: skip
        row |= dict.fromkeys(COUNTERS, NAN)
        if self.trainer.ref_model is not None or self.trainer.ref_source == "old" or a.beta == 0:  # none: PEFT
            row |= {"count/ref_fwd": calls, "tokens/ref_fwd": tokens}
        row |= {"time/ref_share": ref_s / step_time if step_time > 0 else 0.0,
                "throughput/tokens_per_s": sum(lengths) / step_time,
                "throughput/samples_per_s": len(lengths) / step_time,
                "perf/flops": NAN, "perf/flops_per_s": NAN, "perf/mfu": NAN}  # fmt: skip
        row[RSS_KEY] = rss_mb()  # as native (prorl_bench/run/memory.py)
        return row

    def validate_phase(self, step: int) -> float:
        """The bench's held-out evaluation every eval_every steps and at the end; regular ones feed the
        stall trigger (as native: the final one must not, or extending a run would change it). Its
        seconds (0: none at this step)."""
        cfg = self.cfg
        regular = step % cfg.eval_every == 0
        if not (regular or step == cfg.steps):
            return 0.0
        t = time.perf_counter()
        v = self.evaluate(step)
        if regular:
            self.resets.observe_validation(v[cfg.reset.metric.value])
        return time.perf_counter() - t

    def evaluate(self, step: int) -> dict[str, Any]:
        cfg, e = self.cfg, self.cfg.eval
        device = self.eval_kw["device"]
        vgen = torch.Generator(device=device).manual_seed(cfg.seed * 1_000_003 + step)  # as native
        problems = self.eval_kw["problems"]
        v, samples = validate(
            self.policy_view,
            self.eval_kw["task"],
            self.eval_kw["tok"],
            problems,
            temperature=cfg.algo.temperature,
            banned=self.eval_kw["banned"],
            generator=vgen,
            device=device,
            n_samples=e.n_samples,
            ks=e.ks,
            n_sample_prompts=prompts_to_write(step, cfg.steps, len(problems), e.n_sample_prompts),
            chunk=e.batch,
            base_correct=self.base_correct if step > 0 else None,  # coverage classes against the base, as native
        )
        if step == 0 and len(samples) == len(problems):  # the base evaluation writes every prompt
            self.base_correct = correct_counts(samples)
        v = {"step": step, **v}
        self.out.validation(v)
        self.out.samples(step, samples)
        self.val_rows.append(v)
        return v

    def on_save(self, args, state, control, **kw):
        """The bench's state next to TRL's checkpoint of this step (TRL rotates both together)."""
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not state.is_world_process_zero or not ckpt.is_dir():
            return
        payload = {"config": config_dict(self.cfg), "step": state.global_step // self.per, "history": self.history,
                   "val_rows": self.val_rows, "resets": self.resets.state_dict(),
                   "reference": self.resets.reference_state(), "wall_time_s": self.wall(),
                   "base_correct": self.base_correct}  # fmt: skip
        save_verified(ckpt / BENCH_STATE, payload)

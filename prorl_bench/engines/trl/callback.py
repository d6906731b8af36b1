"""``ReferenceResetCallback``: the bench's reference resets and optimizer-state semantics for any TRL
``GRPOTrainer`` — a plain TRL script (``GRPOTrainer(..., callbacks=[ReferenceResetCallback(...)])``)
or the bench's ``engine=trl``. docs/engines.md ("ReferenceResetCallback in a plain TRL script") is the
user's description; this docstring says how it is done.

**When.** At the end of every RL step — one TRL generation batch, ``steps_per_generation x
num_iterations / gradient_accumulation_steps`` optimizer steps — the bench's trigger (``rl/resets.py``:
periodic, kl_spike, stall, polyak; the same registry as native) decides. Steps are counted in RL steps
(``every=50`` is 50 generation batches; TRL's own ``ref_model_sync_steps`` counts optimizer steps).

**The signal, on TRL's public surface only.** A trigger that reads the KL (kl_spike: ``observe_step``)
or a training metric (stall with ``metric="reward"``) gets TRL's own logged values from ``on_log``'s
``logs``: the callback sets ``control.should_log`` at every RL-step end (TrainerControl, the documented
way for a callback to ask the Trainer for a log), so whatever ``logging_steps`` is, every RL step's
values reach it; logs inside an RL step (``logging_steps`` smaller than the RL step) are averaged,
weighted by the optimizer steps each covers. In a plain script the KL is TRL's ``kl``: k3 of the
policy being updated to the reference, its mean over the RL step's optimizer steps. ``engine=trl``
does not use that path: it calls ``rl_step_end(step, kl=...)`` itself with the bench's ``kl/ref``,
measured as native measures it (``run/kl_measure.reference_kl``; engines/trl/rundir.py). A stall
metric named ``eval_*`` is read from ``on_evaluate``'s metrics instead (one observation per evaluation).

**A reset** is the bench's one reset sequence (``rl/reset_sequence.py``: ``decide`` then ``reset``, the
same code the native trainer calls; this callback is its ``ResetTarget``). It

1. moves the reference: ``alpha = 1`` copies the policy, ``alpha < 1`` (polyak) mixes the weights,
   ``ref <- (1 - alpha) ref + alpha policy``. A full model: TRL's ``ref_model``, parameter by parameter
   (``rl/resets.reset_reference``). A PEFT LoRA policy: a frozen adapter named ``ref``, which TRL's
   trainer then uses as its reference (``peft_reference.py``; the mix is of the adapters' effective
   weight updates, so the merged reference weights are the mix — exactly, and independent of the RNG);
   TRL's own ``sync_ref_model`` refuses PEFT (trl#2684, #3108);
2. applies the bench's optimizer-state transform (``rl/opt_state.apply_opt_reset``: keep / hard / soft /
   asym, ``step`` keep / reset) to TRL's AdamW;
3. restarts the LR factor the callback multiplies into TRL's ``LambdaLR`` (``rl/schedule.LRSchedule``):
   ``rewarmup_steps`` re-warms over N RL steps; a ``hard`` reset (a fresh optimizer) restarts the
   warm-up — the callback's ``lr_warmup_steps``, or TRL's own ``warmup_steps`` converted to RL steps
   (TRL's schedule itself warms up once, at the start; giving both warm-ups is refused: they multiply).

**Binding.** At ``on_train_begin`` from the callback kwargs every Trainer passes (``model``,
``optimizer``, ``lr_scheduler``). TRL passes its ``ref_model`` to no callback: for a full model the
callback takes it from the Trainer that is calling it — the ``transformers.Trainer`` on the call stack
whose ``callback_handler.callbacks`` holds this callback (its public ``ref_model``) — or from
``trainer=`` / ``bind(trainer)`` when given. A PEFT reference lives in the model itself.

**Checkpoints.** ``on_save`` writes ``reference_reset_state.pt`` into the checkpoint TRL just wrote
(``args.output_dir/checkpoint-{global_step}``): the trigger's state, the LR factor, the reset log, the
partial RL step's signal and — once a reset has happened — the reference (a full model's weights; the
``ref`` adapter's layout and weights). ``on_train_begin`` of a resumed run (``state.global_step > 0``)
reads it back from ``resume_from(path)`` if called, else ``args.resume_from_checkpoint``, else
``args.output_dir/checkpoint-{global_step}``, and fails loudly when none has it.

No private TRL or transformers attribute is read (tests/engines/test_trl_callback.py pins it).
"""

from __future__ import annotations

import difflib
import inspect
import math
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from prorl_bench.config import OptResetConfig, ResetConfig, ResetSource, StepPolicy
from prorl_bench.config.options import common_keys, split_section
from prorl_bench.engines.trl import peft_reference
from prorl_bench.engines.trl.config_map import REFERENCE_ADAPTER, trl_version_problem
from prorl_bench.engines.trl.peft_reference import is_peft, reset_peft_reference
from prorl_bench.registry import OPT_TRANSFORMS, RESET_TRIGGERS
from prorl_bench.rl import reset_sequence
from prorl_bench.rl.resets import ResetSchedule, StepCounterHazardWarning, Trigger, reset_reference, step_counter_hazard
from prorl_bench.rl.schedule import LRSchedule

__all__ = ["ReferenceResetCallback", "REFERENCE_ADAPTER", "STATE_FILE", "TRLVersionWarning", "unwrap"]

STATE_FILE = "reference_reset_state.pt"  # in TRL's checkpoint-N directory
STATE_VERSION = 1
SELECTOR = "kind"  # the one key naming the option in both dicts: reset={"kind": ...}, opt_reset={"kind": ...}


class TRLVersionWarning(UserWarning):
    """The installed TRL is outside the range the callback is tested on."""


def unwrap(obj: Any, attr: str) -> Any:
    """The object inside accelerate's wrappers (AcceleratedOptimizer.optimizer, DDP.module, ...)."""
    while hasattr(obj, attr):
        obj = getattr(obj, attr)
    return obj


def rl_steps_per(args: Any) -> int:
    """Optimizer steps per generation batch (one RL step) of a ``GRPOConfig``."""
    micro = args.steps_per_generation * args.num_iterations
    if micro % args.gradient_accumulation_steps:
        raise ValueError(
            f"steps_per_generation x num_iterations ({micro}) is not a multiple of gradient_accumulation_steps "
            f"({args.gradient_accumulation_steps}): an RL step would end inside an optimizer step"
        )
    return micro // args.gradient_accumulation_steps


# --------------------------------------------------------------------------- the two dicts


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=2, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _option_dict(value: Any, what: str, registry: Any) -> dict[str, Any]:
    """``value`` (a name or a dict with ``kind``) as a dict with a checked ``kind``."""
    if isinstance(value, str):
        value = {SELECTOR: value}
    if not isinstance(value, Mapping):
        raise TypeError(f"{what}: a name or a dict ({what}={{'kind': ..., ...}}), got {type(value).__name__}")
    value = dict(value)
    for old in ("trigger", "name"):
        if old in value:
            raise ValueError(
                f"{what}: unknown key {old!r}; did you mean 'kind'? ({what}={{'kind': {value[old]!r}, ...}})"
            )
    if SELECTOR not in value:
        raise ValueError(
            f"{what}: name the option with 'kind' ({what}={{'kind': ..., ...}}; one of {registry.names()})"
        )
    kind = value[SELECTOR]
    if kind not in registry.names():
        names = registry.names()
        raise ValueError(f"{what}: unknown kind {kind!r}: one of {names}{_did_you_mean(str(kind), names)}")
    return value


def reset_config(value: Any) -> tuple[ResetConfig, str | None]:
    """(ResetConfig, stall metric) from ``None`` (no resets), a trigger's name, a dict
    ``{"kind": trigger, <its parameters>, "alpha", "min_spacing", "metric"}`` or a ResetConfig (the
    engine's own config: its stall trigger is fed by the caller, ``observe_validation``)."""
    if isinstance(value, ResetConfig):
        return value, None
    value = _option_dict("none" if value is None else value, "reset", RESET_TRIGGERS)
    kind = value.pop(SELECTOR)
    metric = value.pop("metric", None)
    if "restore_beta" in value:
        raise ValueError("reset: 'restore_beta' resets an adaptive KL coefficient; TRL's beta is fixed")
    if metric is not None and kind != "stall":
        raise ValueError(f"reset: 'metric' is read by the stall trigger only (kind={kind!r})")
    if kind == "stall" and not isinstance(metric, str):
        raise ValueError(
            "reset: the stall trigger needs 'metric', the logged value it watches: a training log key read at "
            "every RL step (reset={'kind': 'stall', 'metric': 'reward', 'patience': 2}) or an evaluation metric "
            "(eval_*, e.g. 'eval_reward', with GRPOConfig(eval_strategy='steps') and an eval_dataset)"
        )
    optimizer_keys = (common_keys(OptResetConfig) | {"factor", "m_factor", "v_factor"}) - common_keys(ResetConfig)
    for key in value:
        if key in optimizer_keys:
            raise ValueError(f"reset: {key!r} is an optimizer-state key: put it in opt_reset={{...}}")
    try:
        return ResetConfig(**split_section({"trigger": kind, **value}, "reset", ResetConfig)), metric
    except ValueError as e:
        raise ValueError(str(e).replace("config key reset.", "key reset.")) from None


def opt_config(value: Any) -> OptResetConfig:
    """OptResetConfig from ``None`` (keep), a transform's name (``"hard"``), a dict ``{"kind": ...,
    "step": "keep"|"reset", "rewarmup_steps": N, <its parameters>}`` or an OptResetConfig. ``step``
    omitted is the transform's own when it fixes one (hard: reset), else keep."""
    if isinstance(value, OptResetConfig):
        return value
    value = _option_dict("keep" if value is None else value, "opt_reset", OPT_TRANSFORMS)
    for key in value:
        if key in common_keys(ResetConfig) | {"every", "kl_threshold", "patience"} and key != SELECTOR:
            raise ValueError(f"opt_reset: {key!r} is a reset key: put it in reset={{...}}")
    if "step" not in value:
        value["step"] = OPT_TRANSFORMS.meta(value[SELECTOR]).get("step") or "keep"
    try:
        value["step"] = StepPolicy(value["step"])
    except ValueError:
        raise ValueError(f"opt_reset: step={value['step']!r}: 'keep' or 'reset'") from None
    try:
        return OptResetConfig(**split_section(value, "opt_reset", OptResetConfig))
    except ValueError as e:
        raise ValueError(str(e).replace("config key opt_reset.", "key opt_reset.")) from None


def _observes_steps(trigger: Trigger) -> bool:
    """Whether the trigger reads each step's KL (it overrides ``observe_step``)."""
    return type(trigger).observe_step is not Trigger.observe_step


class ReferenceResetCallback(TrainerCallback):
    """Reference resets with the bench's semantics for a TRL ``GRPOTrainer`` (module docstring).

    ``reset``: None (no resets, the default), a trigger's name (``"periodic"``: its defaults) or a dict
    ``{"kind": "periodic", "every": 50}`` — ``kind`` one of periodic, kl_spike, stall, polyak; its
    parameters (every; kl_threshold, kl_multiple, kl_ema, kl_warmup; metric, patience, min_delta);
    ``alpha`` (the mix, default 1 = a copy, polyak 0.6); ``min_spacing`` (RL steps).
    ``opt_reset``: None (keep), a transform's name (``"hard"``) or a dict ``{"kind": "soft",
    "factor": 0.1, "step": "reset", "rewarmup_steps": 10}`` — kind one of keep, hard, soft, asym.
    ``lr_warmup_steps``: an initial LR warm-up the callback applies itself (RL steps; the engine's
    ``algo.lr_warmup_steps``); leave 0 when ``GRPOConfig.warmup_steps`` warms up.
    ``on_reset(step, reason, info)``: called after each reset.
    ``trainer``: bind now (otherwise at ``on_train_begin``).
    """

    def __init__(self, reset: Any = None, opt_reset: Any = None, *, lr_warmup_steps: int = 0,
                 on_reset: Callable[..., Any] | None = None, trainer: Any = None,
                 metric: Any = None) -> None:  # fmt: skip
        if not (reset is None or isinstance(reset, (str, Mapping, ResetConfig))):
            raise TypeError(
                f"ReferenceResetCallback(reset=...): got {type(reset).__name__}. The trainer is no longer the first "
                "argument: GRPOTrainer(..., callbacks=[ReferenceResetCallback(reset=..., opt_reset=...)]), or "
                "ReferenceResetCallback(..., trainer=trainer)"
            )
        if metric is not None:
            raise TypeError("ReferenceResetCallback(metric=...): the metric is a reset key now: "
                            f"reset={{'kind': 'stall', 'metric': {metric!r}, ...}}")  # fmt: skip
        why = trl_version_problem()
        if why is not None:
            warnings.warn(f"ReferenceResetCallback: {why}", TRLVersionWarning, stacklevel=2)
        self.reset_cfg, self.metric = reset_config(reset)
        self.opt_cfg = opt_config(opt_reset)
        # the CLI's config check warns for the engine's ResetConfig; a script's dicts are checked here
        if not isinstance(reset, ResetConfig) and (hazard := step_counter_hazard(self.reset_cfg, self.opt_cfg)):
            warnings.warn(hazard, StepCounterHazardWarning, stacklevel=2)
        if ResetSource(self.reset_cfg.source) != ResetSource.current:  # config_map refuses it for engine=trl too
            raise ValueError(
                f"ReferenceResetCallback: reset.source={ResetSource(self.reset_cfg.source).value} is not supported "
                "(it resets TRL's reference from the live policy and keeps no snapshot of the best held-out one)"
            )
        if lr_warmup_steps < 0:
            raise ValueError(f"lr_warmup_steps={lr_warmup_steps}: >= 0")
        self.schedule = ResetSchedule(self.reset_cfg)
        self.lr = LRSchedule(1.0, lr_warmup_steps)  # a factor on TRL's own schedule (base 1)
        self.lr_warmup_steps = lr_warmup_steps
        self.on_reset = on_reset
        self.resets: list[dict[str, Any]] = []
        # what the trigger reads from TRL's logs: the KL (kl_spike), a training metric (stall)
        self.metric_from = None if self.metric is None else ("eval" if self.metric.startswith("eval_") else "train")
        self.needs_logs = _observes_steps(self.schedule.trigger) or self.metric_from == "train"
        self._acc = self._empty_acc()  # the current RL step's logged values, weighted by optimizer steps
        self._logged_to = 0  # global step of the last training log folded into _acc
        self._evals = [0, 0]  # evaluations since the last RL-step end, of them with the stall metric
        self._eval_keys: list[str] = []
        self._resume_path: str | Path | None | bool = None  # resume_from(); False: start fresh
        self.trainer: Any = None
        self.args: Any = None
        self.model: Any = None
        self.ref_model: Any = None
        self.optimizer: Any = None
        self.lr_scheduler: Any = None
        self.per_rl_step = 0
        self.trl_warmup_rl_steps = 0
        self._wrapped: Any = None  # the scheduler whose lambdas carry the LR factor
        if trainer is not None:
            self.bind(trainer)

    # ------------------------------------------------------------------ binding

    def bind(self, trainer: Any = None, *, args: Any = None, model: Any = None, optimizer: Any = None,
             lr_scheduler: Any = None) -> ReferenceResetCallback:  # fmt: skip
        """Bind the objects a reset changes. ``trainer``: a GRPOTrainer (its args, model, ref_model,
        and — once training has started — optimizer and scheduler); the keywords override it."""
        if trainer is not None:
            self.trainer = trainer
            self.ref_model = trainer.ref_model

        def first(*xs: Any) -> Any:
            return next((x for x in xs if x is not None), None)

        src = self.trainer
        self.args = first(args, self.args, getattr(src, "args", None))
        self.model = first(model, self.model, getattr(src, "model", None))
        self.optimizer = first(optimizer, getattr(src, "optimizer", None), self.optimizer)
        self.lr_scheduler = first(lr_scheduler, getattr(src, "lr_scheduler", None), self.lr_scheduler)
        if self.args is not None:
            self.per_rl_step = rl_steps_per(self.args)
        if self.model is not None and self.args is not None:
            self._check_reference()
        return self

    def _policy(self) -> torch.nn.Module:
        return unwrap(self.model, "module")

    def _check_reference(self) -> None:
        if self.reset_cfg.trigger == "none":
            return
        if getattr(self.args, "beta", None) == 0.0:
            raise ValueError(
                "ReferenceResetCallback: GRPOConfig(beta=0) has no KL term, so TRL computes no reference and a "
                "reference reset would change nothing: set beta > 0, or reset=None"
            )
        if not is_peft(self._policy()) and self.ref_model is None and self.trainer is not None:
            raise ValueError("ReferenceResetCallback needs a reference model: GRPOConfig(beta > 0) or a PEFT policy")

    def _find_trainer(self) -> Any:
        """The ``transformers.Trainer`` whose callbacks hold this callback, on the call stack (TRL hands
        its ``ref_model`` to no callback). None when not called from inside a Trainer."""
        from transformers import Trainer

        frame = inspect.currentframe()
        try:
            while frame is not None:
                obj = frame.f_locals.get("self")
                if isinstance(obj, Trainer) and any(cb is self for cb in obj.callback_handler.callbacks):
                    return obj
                frame = frame.f_back
        finally:
            del frame
        return None

    def _warmups(self, args: Any, state: Any) -> None:
        """TRL's own warm-up in RL steps; both it and ``lr_warmup_steps`` would multiply: refused."""
        total = state.max_steps if state.max_steps > 0 else args.max_steps
        trl_warmup = args.get_warmup_steps(total) if total > 0 else 0
        if trl_warmup > 0 and self.lr_warmup_steps > 0:
            raise ValueError(
                f"ReferenceResetCallback(lr_warmup_steps={self.lr_warmup_steps}) and GRPOConfig warm-up "
                f"({trl_warmup} optimizer steps) would multiply: use one (a hard reset restarts either)"
            )
        self.trl_warmup_rl_steps = math.ceil(trl_warmup / self.per_rl_step)

    # ------------------------------------------------------------------ the Trainer's events

    def on_init_end(self, args, state, control, **kw):
        self.bind(args=args, model=kw.get("model"))  # early errors (beta = 0, the RL step's length)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kw):
        self.bind(args=args, model=model, optimizer=optimizer, lr_scheduler=lr_scheduler)
        if (self.reset_cfg.trigger != "none" and self.ref_model is None and not is_peft(self._policy())
                and (trainer := self._find_trainer()) is not None):  # fmt: skip
            self.trainer, self.ref_model = trainer, trainer.ref_model
        if self.reset_cfg.trigger != "none" and self.ref_model is None and not is_peft(self._policy()):
            raise ValueError(
                "ReferenceResetCallback found no reference model: TRL loads one for a full model at beta > 0; pass "
                "the trainer (ReferenceResetCallback(..., trainer=trainer) or callback.bind(trainer)) when training "
                "is not started by a transformers Trainer that holds this callback"
            )
        self._warmups(args, state)
        self.wrap_lr()
        self._logged_to = state.global_step
        self._acc = self._empty_acc()
        if state.global_step > 0 and self._resume_path is not False:
            self._resume(args, state)

    def on_step_end(self, args, state, control, **kw):
        if state.global_step % self.per_rl_step:
            return
        if self.needs_logs:
            control.should_log = True  # the RL step's values arrive in on_log, whatever logging_steps is
        else:
            self._boundary(state.global_step // self.per_rl_step)

    def on_log(self, args, state, control, logs=None, **kw):
        if not logs or "loss" not in logs:  # evaluation logs, the end-of-training summary
            return
        weight = state.global_step - self._logged_to
        if weight <= 0:
            return
        self._logged_to = state.global_step
        for key in self._acc:
            v = logs.get(key)
            if v is not None and not math.isnan(float(v)):
                self._acc[key][0] += float(v) * weight
                self._acc[key][1] += weight
        if self.needs_logs and state.global_step % self.per_rl_step == 0:
            self._boundary(state.global_step // self.per_rl_step)

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        if self.metric_from != "eval":
            return
        self._evals[0] += 1
        if metrics and self.metric in metrics:
            self._evals[1] += 1
            self.observe_validation(float(metrics[self.metric]))
        else:
            self._eval_keys = sorted(metrics or {})

    def on_save(self, args, state, control, **kw):
        if not args.should_save:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not folder.is_dir():
            raise FileNotFoundError(
                f"ReferenceResetCallback.on_save: TRL's checkpoint {folder} does not exist, so the reference and the "
                "trigger state cannot be saved with it"
            )
        tmp = folder / f".{STATE_FILE}.tmp"
        torch.save(self.checkpoint_state(state.global_step), tmp)
        os.replace(tmp, folder / STATE_FILE)

    # ------------------------------------------------------------------ the RL-step boundary

    def _empty_acc(self) -> dict[str, list[float]]:
        keys = (["kl"] if _observes_steps(self.schedule.trigger) else []) + (
            [self.metric] if self.metric_from == "train" else []
        )
        return {k: [0.0, 0] for k in keys}

    def _boundary(self, step: int) -> dict[str, Any] | None:
        """The end of RL step ``step`` inside TRL's loop: the step's logged signal to the trigger."""
        values = {k: (s / n if n else None) for k, (s, n) in self._acc.items()}
        self._acc = self._empty_acc()
        if "kl" in values and values["kl"] is None:
            raise RuntimeError(
                f"RL step {step}: TRL logged no 'kl' (GRPOConfig beta > 0 logs it): the {self.reset_cfg.trigger} "
                "trigger has no signal"
            )
        metric = None
        if self.metric_from == "train":
            metric = values[self.metric]
            if metric is None:
                raise KeyError(f"RL step {step}: TRL's logs have no {self.metric!r} for the stall trigger "
                               "(training log keys: reward, kl, entropy, completions/mean_length, ...)")  # fmt: skip
        if self.metric_from == "eval" and self._evals[0] and not self._evals[1]:
            raise KeyError(f"the stall trigger's metric {self.metric!r} is not among the evaluation's metrics "
                           f"{self._eval_keys}")  # fmt: skip
        self._evals = [0, 0]
        return self.rl_step_end(step, kl=values.get("kl"), metric=metric)

    def observe_validation(self, value: float) -> None:
        """One observation of the stall trigger's metric (an evaluation; the engine's held-out one)."""
        self.schedule.observe_validation(value)

    def rl_step_end(self, step: int, kl: float | None = None, metric: float | None = None) -> dict[str, Any] | None:
        """Feed the trigger RL step ``step``'s KL (and stall metric); reset when it fires — the
        decision and the reset are the bench's one sequence (``rl/reset_sequence.py``; this callback is
        its ``ResetTarget``). Returns the reset's description (None: no reset)."""
        reason = reset_sequence.decide(self.schedule, step, kl, metric)
        if reason is None:
            return None
        if self.metric is not None:  # the trigger names the bench's own metric key
            reason = reason.replace(self.reset_cfg.metric.value, self.metric, 1)
        info = reset_sequence.reset(self.schedule, step, self.opt_cfg, self._restart_warmup(), self)
        info = {"reason": reason, **info}
        self.resets.append({"step": step, **info})
        if self.on_reset is not None:
            self.on_reset(step, reason, info)
        return info

    # ------------------------------------------------------------------ the reset's target (ResetTarget)

    def reset_optimizer(self) -> torch.optim.Optimizer:
        """TRL's AdamW, unwrapped from accelerate."""
        return self._optimizer()

    @torch.no_grad()
    def move_reference(self, alpha: float) -> dict[str, Any]:
        """TRL's ``ref_model`` (parameter by parameter) or a PEFT policy's ``ref`` adapter moves to the policy."""
        policy = self._policy()
        if is_peft(policy):
            return reset_peft_reference(policy, alpha)
        if self.ref_model is None:
            raise ValueError("ReferenceResetCallback is not bound to a reference model (bind(trainer))")
        reset_reference(unwrap(self.ref_model, "module"), policy, alpha)
        return {}

    def restart_lr(self, start_step: int, warmup: int) -> None:
        """Restart the LR factor multiplied into TRL's scheduler (RL steps)."""
        self.lr.restart(start_step, warmup)

    def after_reset(self, step: int) -> dict[str, Any]:
        """The LR TRL's next optimizer step uses, once the factor is applied."""
        self._refresh_lr()
        return {"next_lr": self._optimizer().param_groups[0]["lr"]}

    def _restart_warmup(self) -> int:
        """The warm-up a fresh optimizer restarts with: the callback's own, or TRL's in RL steps."""
        return max(self.lr_warmup_steps, self.trl_warmup_rl_steps)

    # ------------------------------------------------------------------ the LR factor

    def _optimizer(self) -> torch.optim.Optimizer:
        opt = self.optimizer if self.optimizer is not None else getattr(self.trainer, "optimizer", None)
        if opt is None:
            raise ValueError("ReferenceResetCallback has no optimizer yet (bound at on_train_begin)")
        return unwrap(opt, "optimizer")

    def _scheduler(self) -> Any:
        sched = self.lr_scheduler if self.lr_scheduler is not None else getattr(self.trainer, "lr_scheduler", None)
        return None if sched is None else unwrap(sched, "scheduler")

    def _lr_factor_used(self) -> bool:
        """Whether the factor can ever differ from 1 (otherwise TRL's scheduler is left untouched)."""
        restart = reset_sequence.lr_restart_warmup(self.opt_cfg, self._restart_warmup())
        return self.lr_warmup_steps > 0 or (self.reset_cfg.trigger != "none" and bool(restart))

    def wrap_lr(self) -> None:
        """Multiply the LR factor into the scheduler's lambdas (once per scheduler) and set the LR."""
        if not self._lr_factor_used():
            return
        sched = self._scheduler()
        if sched is None or not hasattr(sched, "lr_lambdas"):
            raise ValueError(
                f"ReferenceResetCallback multiplies its LR warm-up into a LambdaLR scheduler (TRL's default); got "
                f"{type(sched).__name__}. Use a lr_scheduler_type that builds a LambdaLR (constant, linear, cosine), "
                "or opt_reset without an LR restart (keep / soft / asym without rewarmup_steps)"
            )
        if self._wrapped is not sched:  # plain closures: LambdaLR.state_dict skips functions (no pickling)
            per = self.per_rl_step
            sched.lr_lambdas = [(lambda k, f=f: f(k) * self.lr.factor(k // per + 1)) for f in sched.lr_lambdas]
            self._wrapped = sched
        self._refresh_lr()

    def _refresh_lr(self) -> None:
        """Set each group's LR for the next optimizer step from the (possibly restarted) factor."""
        sched = self._scheduler()
        if sched is None or self._wrapped is not sched:
            return
        for group, base, f in zip(sched.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
            group["lr"] = base * f(sched.last_epoch)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Trigger state, LR factor, reset log (plain containers); the reference is ``reference_state``."""
        return {"schedule": self.schedule.state_dict(), "lr": (self.lr.start, self.lr.warmup), "resets": self.resets}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.schedule.load_state_dict(state["schedule"])
        self.lr.start, self.lr.warmup = state["lr"]
        self.resets = list(state["resets"])

    def reference_state(self) -> dict[str, Any]:
        """The reference's own tensors: a full model's state dict, or the PEFT ``ref`` adapter's layout
        and tensors (empty: no reference of its own yet)."""
        policy = self._policy()
        if is_peft(policy):
            return peft_reference.reference_state(policy)
        if self.ref_model is None:  # beta = 0: no reference at all
            return {}
        return unwrap(self.ref_model, "module").state_dict()

    def reference_bytes(self) -> int:
        """Bytes the reference holds of its own (a full model's weights; the ``ref`` adapter's)."""
        state = self.reference_state()
        tensors = state.get("tensors", {}) if "layout" in state else state
        return sum(t.numel() * t.element_size() for t in tensors.values())

    @torch.no_grad()
    def load_reference_state(self, tensors: dict[str, Any]) -> None:
        if not tensors:
            return
        policy = self._policy()
        if is_peft(policy):
            peft_reference.load_reference_state(policy, tensors)
        else:
            unwrap(self.ref_model, "module").load_state_dict(tensors)

    def checkpoint_state(self, global_step: int) -> dict[str, Any]:
        """What ``on_save`` writes: the trigger, LR factor, reset log, the partial RL step's signal, and
        the reference once a reset has moved it away from what TRL builds at start-up."""
        return {
            "version": STATE_VERSION,
            "global_step": global_step,
            "trigger": self.reset_cfg.trigger,
            "opt_reset": self.opt_cfg.kind,
            **self.state_dict(),
            "acc": {k: list(v) for k, v in self._acc.items()},
            "reference": self.reference_state() if self.resets else {},
        }

    def resume_from(self, path: str | Path | bool) -> ReferenceResetCallback:
        """Resume the callback's state from ``path`` (a checkpoint directory) at the next
        ``on_train_begin``; ``False``: start the callback fresh (the reference TRL built). Needed only
        when the checkpoint is neither ``args.resume_from_checkpoint`` nor in ``args.output_dir``."""
        self._resume_path = path
        return self

    def _resume(self, args: Any, state: Any) -> None:
        step = state.global_step
        if self._resume_path not in (None, True):
            candidates = [Path(self._resume_path)]
        else:
            candidates = [Path(p) for p in (args.resume_from_checkpoint,) if isinstance(p, (str, os.PathLike))]
            candidates.append(Path(args.output_dir) / f"checkpoint-{step}")
        found = next((c / STATE_FILE for c in candidates if (c / STATE_FILE).is_file()), None)
        if found is None:
            raise FileNotFoundError(
                f"ReferenceResetCallback: training resumes at optimizer step {step} but no {STATE_FILE} is in "
                f"{[str(c) for c in candidates]}: the reference, the trigger state and the reset log would be lost. "
                "Call callback.resume_from(CHECKPOINT_DIR) before train(), or callback.resume_from(False) to start "
                "the callback fresh (a checkpoint saved without it)"
            )
        saved = torch.load(found, map_location="cpu", weights_only=True)
        if saved.get("version") != STATE_VERSION or saved["global_step"] != step:
            raise ValueError(f"{found}: saved at optimizer step {saved.get('global_step')} (version "
                             f"{saved.get('version')}); training resumes at step {step}")  # fmt: skip
        if (saved["trigger"], saved["opt_reset"]) != (self.reset_cfg.trigger, self.opt_cfg.kind):
            raise ValueError(
                f"{found}: saved by reset={saved['trigger']!r} opt_reset={saved['opt_reset']!r}; this callback "
                f"is reset={self.reset_cfg.trigger!r} opt_reset={self.opt_cfg.kind!r}"
            )
        self.load_state_dict(saved)
        if set(saved["acc"]) == set(self._acc):
            self._acc = {k: list(v) for k, v in saved["acc"].items()}
        self.load_reference_state(saved["reference"])
        self._refresh_lr()

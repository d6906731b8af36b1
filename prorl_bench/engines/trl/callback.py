"""``ReferenceResetCallback``: the bench's reference resets and optimizer-state semantics for any TRL
``GRPOTrainer`` — a plain TRL script or the bench's ``engine=trl``.

At the end of every RL step (one TRL generation batch: ``steps_per_generation x num_iterations``
optimizer steps) the bench's trigger (``rl/resets.py``: periodic, kl_spike, stall, polyak — the same
registry as native) decides whether to reset. A reset

1. copies the policy into the reference (``reset.alpha`` < 1: an alpha-mix): the trainer's
   ``ref_model`` parameter by parameter (``rl/resets.reset_reference``); for a PEFT policy a frozen
   adapter named ``ref``, which TRL's trainer then uses as the reference (it calls
   ``use_adapter(model, "ref")`` whenever that adapter exists) — so resets work with LoRA, where
   TRL's own ``sync_ref_model`` refuses (trl#2684, #3108);
2. applies the bench's optimizer-state transform (``rl/opt_state.apply_opt_reset``: keep / hard /
   soft / asym, step keep / reset) to TRL's AdamW;
3. restarts the bench's LR factor (``rl/schedule.LRSchedule``: re-warm-up over N RL steps; a hard
   reset restarts the warm-up as a fresh optimizer would), multiplied into TRL's LambdaLR.

The kl_spike trigger reads TRL's logged ``kl`` (k3 of the current policy to the reference, the mean
over the RL step's optimizer steps); stall reads ``observe_validation`` (the bench's evaluation) or,
in a plain script, the trainer's ``evaluate`` metrics under ``metric`` (e.g. ``eval_reward``).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from transformers import TrainerCallback

from prorl_bench.config import OptResetConfig, ResetConfig, ResetSource, StepPolicy
from prorl_bench.config.options import split_section
from prorl_bench.engines.trl.config_map import REFERENCE_ADAPTER
from prorl_bench.registry import OPT_TRANSFORMS
from prorl_bench.rl.opt_state import apply_opt_reset, moment_norms
from prorl_bench.rl.resets import ResetSchedule, reset_reference
from prorl_bench.rl.schedule import LRSchedule


def _as_config(kind: type, value: Any) -> Any:
    """A ResetConfig / OptResetConfig from itself or a dict of its fields (``step`` as text allowed;
    omitted, it is the transform's own when it fixes one: hard -> reset)."""
    if isinstance(value, kind):
        return value
    value = dict(value or {})
    if kind is OptResetConfig and "step" not in value:  # a transform that fixes its step policy (hard) states it
        value["step"] = OPT_TRANSFORMS.meta(value.get("kind", "keep")).get("step") or "keep"
    if "step" in value:
        value["step"] = StepPolicy(value["step"])
    # an option's own parameters are flat keys ({"trigger": "periodic", "every": 50}): move them into params
    return kind(**split_section(value, "reset" if kind is ResetConfig else "opt_reset", kind))


def unwrap(obj: Any, attr: str) -> Any:
    """The object inside accelerate's wrappers (AcceleratedOptimizer.optimizer, DDP.module, ...)."""
    while hasattr(obj, attr):
        obj = getattr(obj, attr)
    return obj


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "add_adapter")


def rl_steps_per(args: Any) -> int:
    """Optimizer steps per generation batch (one RL step) of a ``GRPOConfig``."""
    micro = args.steps_per_generation * args.num_iterations
    if micro % args.gradient_accumulation_steps:
        raise ValueError(
            f"steps_per_generation x num_iterations ({micro}) is not a multiple of gradient_accumulation_steps "
            f"({args.gradient_accumulation_steps}): an RL step would end inside an optimizer step"
        )
    return micro // args.gradient_accumulation_steps


@torch.no_grad()
def reset_peft_reference(model: torch.nn.Module, alpha: float = 1.0) -> None:
    """The PEFT model's frozen ``ref`` adapter <- alpha * active adapter + (1 - alpha) * ref.

    Created on first use as a copy of the active adapter's config with B = 0 (the base's function,
    which is what TRL's disabled-adapter reference was). Its weights never train (requires_grad off,
    not in the optimizer)."""
    active = model.active_adapter
    if REFERENCE_ADAPTER not in model.peft_config:
        model.add_adapter(REFERENCE_ADAPTER, copy.deepcopy(model.peft_config[active]))
        model.set_adapter(active)  # adding may not change the trained adapter
        for name, p in model.named_parameters():
            if f".{REFERENCE_ADAPTER}." in name and "lora_B" in name:
                p.zero_()
    params = dict(model.named_parameters())
    for name, p in params.items():
        if f".{REFERENCE_ADAPTER}." not in name:
            continue
        src = params[name.replace(f".{REFERENCE_ADAPTER}.", f".{active}.")]
        if alpha == 1.0:
            p.copy_(src)
        else:
            p.mul_(1.0 - alpha).add_(src, alpha=alpha)
        p.requires_grad_(False)


def lr_restart(opt: OptResetConfig, lr_warmup_steps: int) -> int | None:
    """Warm-up length (RL steps) the LR factor restarts with after a reset, None for no restart: a
    transform that fixes ``step=reset`` (hard) is a fresh optimizer, so its schedule starts over too."""
    if OPT_TRANSFORMS.meta(opt.kind).get("step") == "reset":
        return max(lr_warmup_steps, opt.rewarmup_steps)
    return opt.rewarmup_steps if opt.rewarmup_steps > 0 else None


class ReferenceResetCallback(TrainerCallback):
    """Reference resets with the bench's semantics for a TRL ``GRPOTrainer``.

    ``trainer``: the GRPOTrainer (its reference model, optimizer and scheduler are used).
    ``reset``: a ``ResetConfig`` or a dict of its fields (``{"trigger": "periodic", "every": 50}``).
    ``opt_reset``: an ``OptResetConfig`` or a dict (``{"kind": "hard", "step": "reset"}``).
    ``metric``: the ``evaluate`` metric the stall trigger watches in a plain script.
    ``lr_warmup_steps``: the bench's initial LR warm-up (RL steps; the engine passes algo.lr_warmup_steps).
    ``on_reset(step, reason, info)``: called after each reset (the engine writes the event).
    Use: ``trainer.add_callback(ReferenceResetCallback(trainer, reset=..., opt_reset=...))``.
    """

    def __init__(self, trainer: Any, reset: Any = None, opt_reset: Any = None, metric: str | None = None,
                 lr_warmup_steps: int = 0, on_reset: Any = None) -> None:  # fmt: skip
        self.trainer = trainer
        self.reset_cfg: ResetConfig = _as_config(ResetConfig, reset or {"trigger": "periodic"})
        self.opt_cfg: OptResetConfig = _as_config(OptResetConfig, opt_reset)
        if ResetSource(self.reset_cfg.source) != ResetSource.current:  # config_map refuses it for engine=trl too
            raise ValueError(
                f"ReferenceResetCallback: reset.source={ResetSource(self.reset_cfg.source).value} is not supported "
                "(it resets TRL's reference from the live policy and keeps no snapshot of the best held-out one)"
            )
        self.schedule = ResetSchedule(self.reset_cfg)
        self.lr = LRSchedule(1.0, lr_warmup_steps)  # a factor on TRL's own schedule (base 1)
        self.lr_warmup_steps = lr_warmup_steps
        self.metric = metric
        self.on_reset = on_reset
        self.per_rl_step = rl_steps_per(trainer.args)
        self.resets: list[dict[str, Any]] = []
        self._kl_seen = 0
        self._wrapped: Any = None  # the scheduler whose lambdas carry the LR factor
        policy = unwrap(trainer.model, "module")
        if self.reset_cfg.trigger != "none" and not is_peft(policy) and trainer.ref_model is None:
            raise ValueError(
                "ReferenceResetCallback needs a reference model: GRPOConfig(beta > 0) (TRL loads none at beta=0), "
                "or a PEFT policy"
            )

    # ------------------------------------------------------------------ the LR factor

    def on_train_begin(self, args, state, control, **kw):
        sched = unwrap(kw.get("lr_scheduler") or self.trainer.lr_scheduler, "scheduler")
        if self._wrapped is not sched:  # plain closures: LambdaLR.state_dict skips functions (no pickling)
            per = self.per_rl_step
            sched.lr_lambdas = [(lambda k, f=f: f(k) * self.lr.factor(k // per + 1)) for f in sched.lr_lambdas]
            self._wrapped = sched
        self._refresh_lr(sched)

    def _refresh_lr(self, sched: Any = None) -> None:
        """Set each group's LR for the next optimizer step from the (possibly restarted) factor."""
        sched = unwrap(sched or self.trainer.lr_scheduler, "scheduler")
        for group, base, f in zip(sched.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
            group["lr"] = base * f(sched.last_epoch)

    # ------------------------------------------------------------------ the RL-step boundary

    def on_step_end(self, args, state, control, **kw):
        if state.global_step % self.per_rl_step == 0:
            self.rl_step_end(state.global_step // self.per_rl_step)

    def on_evaluate(self, args, state, control, metrics=None, **kw):
        if self.metric is not None and metrics and self.metric in metrics:
            self.observe_validation(float(metrics[self.metric]))

    def observe_validation(self, value: float) -> None:
        """One held-out evaluation of the stall trigger's metric."""
        self.schedule.observe_validation(value)

    def step_kl(self) -> float | None:
        """TRL's logged ``kl`` averaged over this RL step's entries (None at beta = 0 / no entry yet)."""
        vals = self.trainer._metrics["train"].get("kl", [])
        start = self._kl_seen if self._kl_seen <= len(vals) else 0  # TRL clears its lists at each log
        new = [v for v in vals[start:] if not math.isnan(v)]
        self._kl_seen = len(vals)
        return sum(new) / len(new) if new else None

    def rl_step_end(self, step: int, kl: float | None = None) -> dict[str, Any] | None:
        """Feed the trigger this RL step's KL; reset when it fires. Returns the reset's description."""
        kl = self.step_kl() if kl is None else kl
        self.schedule.observe_step(step, kl)
        reason = self.schedule.due(step)
        if reason is None:
            return None
        info = self.reset_now(step)
        self.schedule.mark_reset(step)
        info = {"reason": reason, **info}
        self.resets.append({"step": step, **info})
        if self.on_reset is not None:
            self.on_reset(step, reason, info)
        return info

    @torch.no_grad()
    def reset_now(self, step: int) -> dict[str, Any]:
        """The reset itself at the end of RL ``step``: reference, optimizer state, LR factor."""
        alpha = self.schedule.alpha
        policy = unwrap(self.trainer.model, "module")
        if is_peft(policy):
            reset_peft_reference(policy, alpha)
        else:
            reset_reference(unwrap(self.trainer.ref_model, "module"), policy, alpha)
        optimizer = unwrap(self.trainer.optimizer, "optimizer")
        m_before, v_before = moment_norms(optimizer)
        opt_info = apply_opt_reset(optimizer, self.opt_cfg)
        warm = lr_restart(self.opt_cfg, self.lr_warmup_steps)
        if warm is not None:
            self.lr.restart(step + 1, warm)
        self._refresh_lr()
        m_after, v_after = moment_norms(optimizer)
        return {
            "action": "polyak" if alpha < 1.0 else "copy",
            "alpha": alpha,
            **opt_info,
            "m_norm_before": m_before,
            "m_norm_after": m_after,
            "v_norm_before": v_before,
            "v_norm_after": v_after,
            "next_lr": unwrap(self.trainer.optimizer, "optimizer").param_groups[0]["lr"],
        }

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Trigger state, LR factor, reset log (plain containers). The reference weights are saved by
        the caller (``reference_state``)."""
        return {"schedule": self.schedule.state_dict(), "lr": (self.lr.start, self.lr.warmup), "resets": self.resets}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.schedule.load_state_dict(state["schedule"])
        self.lr.start, self.lr.warmup = state["lr"]
        self.resets = list(state["resets"])

    def reference_state(self) -> dict[str, torch.Tensor]:
        """The reference's own tensors: the ref model's state dict, or the PEFT ``ref`` adapter's."""
        policy = unwrap(self.trainer.model, "module")
        if is_peft(policy):
            return {n: p.detach().clone() for n, p in policy.named_parameters() if f".{REFERENCE_ADAPTER}." in n}
        if self.trainer.ref_model is None:  # beta = 0: no reference at all
            return {}
        return unwrap(self.trainer.ref_model, "module").state_dict()

    @torch.no_grad()
    def load_reference_state(self, tensors: dict[str, torch.Tensor]) -> None:
        policy = unwrap(self.trainer.model, "module")
        if is_peft(policy):
            if tensors and REFERENCE_ADAPTER not in policy.peft_config:
                reset_peft_reference(policy, 1.0)  # creates the adapter; the weights come next
            params = dict(policy.named_parameters())
            for n, t in tensors.items():
                params[n].copy_(t)
            return
        if tensors:
            unwrap(self.trainer.ref_model, "module").load_state_dict(tensors)

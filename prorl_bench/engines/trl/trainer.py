"""``BenchGRPOTrainer``: TRL's own ``GRPOTrainer`` with two bench choices TRL has no option for, and
the bench's per-stage measurements taken from outside TRL's methods. The loss is TRL's, untouched.

Where the KL term's anchor log-probs come from (``ref_source``; one per variant):

* ``cached`` (A1, C): TRL's default — one reference pass per generation batch, reused by every
  minibatch and PPO epoch. Nothing is changed.
* ``recompute`` (A0): the reference pass moves from the generation batch into every loss computation
  (each minibatch of each PPO epoch): ``compute_loss`` puts a fresh ``ref_per_token_logps`` into the
  minibatch's inputs, computed by TRL's own log-prob function on the reference TRL chose (its
  ``ref_model``, or for PEFT the policy under TRL's ``use_adapter``), and TRL's per-batch pass is
  skipped (below). The reference is frozen, so the values equal A1's: the same trajectory,
  ``ppo_epochs`` times the reference forwards and tokens (tests/engines/test_trl_engine.py).
* ``old`` (B with ``beta`` > 0): no reference model exists (TRL is built with ``beta=0``, so it loads
  none); the KL term is taken against pi_old, the policy that generated the batch, as the bench's B
  does: TRL's ``old_per_token_logps`` become the minibatch's ``ref_per_token_logps`` (``compute_loss``)
  and TRL's public ``beta`` is set to the bench's after TRL is built. Where TRL computes no pi_old
  (``gradient_accumulation_steps`` a multiple of ``steps_per_generation x num_iterations``: one
  minibatch, one epoch here) the policy *is* pi_old at the loss, k3 and its gradient are exactly 0, and
  ``beta`` stays 0 (decided once, from TRL's own rule).

**TRL's private surface, all of it** (``PRIVATE_TRL``; tests/engines/test_trl_engine.py pins each name
to the installed TRL's source, TRL 1.16.0, the newest release checked): TRL has no public way to

1. skip its per-batch reference pass while keeping a KL term (A0, B): ``_generate_and_score_completions``
   is overridden to run TRL's own code with ``beta`` reading 0 — TRL reads ``beta`` there only to decide
   that pass (``if self.beta != 0.0``) — for ``recompute`` and ``old`` only;
2. compute log-probs exactly as its loss does on another model (A0's recompute):
   ``_get_per_token_logps_and_entropies`` is called (not overridden).

Everything else uses TRL's and transformers' public surface: ``compute_loss`` and ``training_step``
(documented Trainer methods to override), the reward functions TRL is given, the policy's ``generate``
and torch forward hooks on the policy.

Measurements (``take_step``: the totals since the last call, one RL step):

* ``time/rollout``: the policy's ``generate`` calls while TRL scores a batch; ``time/reward``: the
  reward functions TRL calls; ``time/old_logprob``: the policy's no-grad forwards while scoring, outside
  ``generate`` and outside a PEFT reference pass (pi_old; 0 when TRL computes none); ``score``: the
  whole batch preparation of a step that generated — from ``training_step``'s start to its
  ``compute_loss`` (TRL's ``_prepare_inputs``: generation, rewards, pi_old and reference passes);
* ``ref_in_loss``: A0's reference passes inside the loss (seconds), so the update's time can
  leave them out as native charges them to ``ref_logprob``;
* ``kl/old``: k3 of the policy being updated to pi_old on each minibatch's tokens (the log-probs TRL's
  loss computed: its forward's ``log_probs`` output, captured by a hook, no extra forward), the bench's
  diagnostic mean (``diagnostic_agg(loss_agg)``), averaged over the RL step's optimizer steps —
  native's definition;
* ``kl_rows``: for the KL to the reference, the signal a reset trigger reads, pi_old's and the
  reference's log-probs of every sampled token with the completion mask (``KLRows``), taken from the
  inputs of the RL step's first pass over its generation batch (TRL's ``old_per_token_logps`` — or the
  loss's own log-probs where TRL computes none, the policy then being pi_old — and
  ``ref_per_token_logps``): the run turns them into ``KLStats`` with the measurement native uses
  (``run/kl_measure.reference_kl``, ``rundir.py``), not with TRL's logged ``kl`` (k3 of the policy
  *being updated*, token-mean).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import use_adapter

from prorl_bench.config import LossAgg
from prorl_bench.engines.trl.config_map import REF_SOURCES, REFERENCE_ADAPTER
from prorl_bench.engines.trl.kl_rows import KLRows
from prorl_bench.rl.losses import diagnostic_agg
from prorl_bench.run.kl_measure import mean_kl

TIMED = ("rollout", "reward", "old_logprob", "score", "ref_in_loss")
# every private TRL name the engine touches, and how (see the module docstring); the test pins each one
PRIVATE_TRL = {
    "_generate_and_score_completions": "overridden: A0 and B run it with beta reading 0 (no per-batch reference pass)",
    "_get_per_token_logps_and_entropies": "called: A0's reference log-probs, computed as TRL's loss computes them",
}


def computes_pi_old(args: Any) -> bool:
    """TRL's rule (grpo_trainer.py, non-vLLM): a generation batch gets ``old_per_token_logps`` when its
    optimizer steps do not all fall inside one gradient-accumulation window."""
    return args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) != 0


class BenchGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with the bench's reference source and stage measurements (module docstring).

    ``ref_source``: one of ``REF_SOURCES``; ``kl_beta``: the KL coefficient for ``old`` (TRL is built
    with ``args.beta=0`` so that it loads no reference model); ``loss_agg``: the bench's aggregation,
    for ``kl/old``'s diagnostic mean."""

    def __init__(self, *args: Any, ref_source: str = "cached", kl_beta: float = 0.0,
                 loss_agg: LossAgg = LossAgg.token, **kwargs: Any) -> None:  # fmt: skip
        if ref_source not in REF_SOURCES:
            raise ValueError(f"ref_source={ref_source!r}: one of {REF_SOURCES}")
        self.bench_seconds = dict.fromkeys(TIMED, 0.0)
        if "reward_funcs" not in kwargs:
            raise TypeError("BenchGRPOTrainer: pass reward_funcs= by keyword (its functions are timed)")
        funcs = kwargs["reward_funcs"]
        funcs = funcs if isinstance(funcs, list) else [funcs]
        kwargs["reward_funcs"] = [self._timed_reward(f) if callable(f) and not isinstance(f, torch.nn.Module) else f
                                  for f in funcs]  # fmt: skip
        super().__init__(*args, **kwargs)
        if ref_source == "old":
            if self.args.beta != 0.0 or kl_beta <= 0.0:
                raise ValueError("ref_source='old' needs GRPOConfig(beta=0) (no reference model) and kl_beta > 0")
            if computes_pi_old(self.args):
                self.beta = kl_beta  # TRL's public coefficient; its scoring pass is kept from it (below)
        self.ref_source = ref_source
        self.diag_agg = diagnostic_agg(loss_agg)
        self.bench_kl_old: list[float] = []
        self.bench_kl_rows = KLRows()
        self.bench_loss_calls = 0  # compute_loss calls: which pass over the generation batch this is
        self.bench_window: str | None = None  # "score" (batch preparation) | "loss" | None
        self.bench_window_t0 = 0.0
        self.bench_generated = False  # the policy generated inside the current scoring window
        self.bench_generating = False
        self.bench_loss_logps: torch.Tensor | None = None
        self.bench_fwd_t0 = 0.0
        self._instrument_policy()

    # ------------------------------------------------------------------ the reference source

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        """PRIVATE_TRL 1: TRL's scoring with ``beta`` reading 0 for A0 and B (no per-batch reference pass)."""
        if self.ref_source == "cached":
            return super()._generate_and_score_completions(inputs)
        beta, self.beta = self.beta, 0.0
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self.beta = beta

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> torch.Tensor:  # fmt: skip
        """TRL's loss on the minibatch, with A0's fresh reference log-probs or B's pi_old as the anchor."""
        if self.bench_window == "score" and self.bench_generated:
            self.bench_seconds["score"] += time.perf_counter() - self.bench_window_t0
        if self.ref_source == "recompute" and self.beta != 0.0:
            inputs = {**inputs, "ref_per_token_logps": self._reference_logps(inputs)}
        elif self.ref_source == "old" and self.beta != 0.0:
            if inputs.get("old_per_token_logps") is None:
                raise RuntimeError("ref_source='old': TRL computed no pi_old for this batch (computes_pi_old)")
            inputs = {**inputs, "ref_per_token_logps": inputs["old_per_token_logps"]}
        self.bench_window, self.bench_loss_logps = "loss", None
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self.bench_window = None
        self._record_kl(inputs)
        return loss

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """Opens the scoring window: TRL prepares (and, at an RL step's start, generates and scores) the
        minibatch between here and ``compute_loss``."""
        self.bench_window, self.bench_window_t0, self.bench_generated = "score", time.perf_counter(), False
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            self.bench_window = None

    @torch.no_grad()
    def _reference_logps(self, inputs: dict[str, Any]) -> torch.Tensor:
        """A0: the minibatch's reference log-probs, (B, T), on the reference TRL itself would use."""
        t0 = time.perf_counter()
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        keep = inputs["completion_ids"].size(1)
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            if self.ref_model is not None:
                logps = self._get_per_token_logps_and_entropies(self.ref_model, ids, mask, keep)[0]  # PRIVATE_TRL 2
            else:  # PEFT: TRL's reference is the policy with adapters disabled, or its "ref" adapter
                peft = self.accelerator.unwrap_model(self.model)
                name = REFERENCE_ADAPTER if REFERENCE_ADAPTER in peft.peft_config else None
                with use_adapter(peft, adapter_name=name):
                    logps = self._get_per_token_logps_and_entropies(self.model, ids, mask, keep)[0]  # PRIVATE_TRL 2
        self.bench_seconds["ref_in_loss"] += time.perf_counter() - t0
        return logps

    # ------------------------------------------------------------------ measurements from outside TRL

    def _timed_reward(self, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)  # TRL reads the name and the signature (functools keeps both)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                self.bench_seconds["reward"] += time.perf_counter() - t0

        return timed

    def _instrument_policy(self) -> None:
        """A timer around the policy's ``generate`` and forward hooks on the policy module."""
        policy = self.model
        generate = policy.generate

        @functools.wraps(generate)
        def timed_generate(*args: Any, **kwargs: Any) -> Any:
            t0, self.bench_generating = time.perf_counter(), True
            try:
                return generate(*args, **kwargs)
            finally:
                self.bench_generating = False
                if self.bench_window == "score":
                    self.bench_seconds["rollout"] += time.perf_counter() - t0
                    self.bench_generated = True

        policy.generate = timed_generate
        policy.register_forward_pre_hook(self._before_forward)
        policy.register_forward_hook(self._after_forward)

    def _before_forward(self, module: Any, args: Any) -> None:
        self.bench_fwd_t0 = time.perf_counter()

    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        if self.bench_generating:
            return
        if self.bench_window == "score" and not torch.is_grad_enabled() and not self._peft_reference_pass():
            self.bench_seconds["old_logprob"] += time.perf_counter() - self.bench_fwd_t0
        elif self.bench_window == "loss" and torch.is_grad_enabled():
            logps = getattr(output, "log_probs", None)  # TRL's loss forward asks for them (fused_lm_head=True)
            self.bench_loss_logps = None if logps is None else logps.detach()

    def _peft_reference_pass(self) -> bool:
        """True while a PEFT policy runs as TRL's reference (adapters disabled or ``ref`` active)."""
        if self.ref_model is not None or self.beta == 0.0:
            return False
        peft = self.accelerator.unwrap_model(self.model)
        if getattr(peft, "active_adapter", None) == REFERENCE_ADAPTER:
            return True
        layer = next((m for m in peft.modules() if hasattr(m, "disable_adapters") and hasattr(m, "lora_A")), None)
        return bool(layer is not None and layer.disable_adapters)

    def _record_kl(self, inputs: dict[str, Any]) -> None:
        """kl/old of this minibatch; on the RL step's first pass over its batch, the rows of ``kl_rows``."""
        logp = self.bench_loss_logps
        self.bench_loss_logps = None
        self.bench_loss_calls += 1
        if logp is None:
            return
        logp = logp[:, -inputs["completion_ids"].size(1) :]  # TRL keeps the completion's positions
        old = inputs.get("old_per_token_logps")
        old = logp if old is None else old  # TRL's own rule: no pi_old pass means the policy is pi_old
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        self.bench_kl_old.append(float(mean_kl("k3", logp, old, mask, self.diag_agg)))
        spg = self.args.steps_per_generation
        first_pass = (self.bench_loss_calls - 1) % (spg * self.args.num_iterations) < spg
        ref = inputs.get("ref_per_token_logps")
        if first_pass and ref is not None and self.ref_source != "old":  # B: the anchor is pi_old, no reference
            self.bench_kl_rows.add(old, ref, mask)

    def take_step(self) -> dict[str, float]:
        """The measurements since the last call (seconds per ``TIMED`` stage; ``kl/old``: the mean over
        the optimizer steps, NaN if none ran; ``kl_rows``: the log-probs of the KL to the reference),
        and start over."""
        out = dict(self.bench_seconds)
        out["kl/old"] = sum(self.bench_kl_old) / len(self.bench_kl_old) if self.bench_kl_old else float("nan")
        out["kl_rows"] = self.bench_kl_rows
        self.bench_seconds = dict.fromkeys(TIMED, 0.0)
        self.bench_kl_old = []
        self.bench_kl_rows = KLRows()
        return out

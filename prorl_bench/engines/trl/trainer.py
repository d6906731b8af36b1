"""``BenchGRPOTrainer``: TRL's own ``GRPOTrainer`` with two bench choices TRL has no option for, and
the bench's per-stage measurements taken around TRL's methods. The loss is TRL's, untouched.

Where the KL term's anchor log-probs come from (``ref_source``; one per variant):

* ``cached`` (A1, C): TRL's default — one reference pass per generation batch, reused by every
  minibatch and PPO epoch. Nothing is overridden.
* ``recompute`` (A0): the reference pass moves from the generation batch into every loss computation
  (each minibatch of each PPO epoch): ``_compute_loss`` puts a fresh ``ref_per_token_logps`` into the
  minibatch's inputs, computed by TRL's own ``_get_per_token_logps_and_entropies`` on the reference
  TRL chose (its ``ref_model``, or for PEFT the policy under TRL's ``use_adapter``), and
  ``_generate_and_score_completions`` skips TRL's per-batch pass (``beta`` reads 0 there: that is the
  only place TRL reads it). The reference is frozen, so the values equal A1's: the same trajectory,
  ``ppo_epochs`` times the reference forwards and tokens (tests/engines/test_trl_engine.py).
* ``old`` (B with ``beta`` > 0): no reference model exists (TRL is built with ``beta=0``, so it loads
  none); the KL term is taken against pi_old, the policy that generated the batch, as the bench's B
  does: TRL's ``old_per_token_logps`` become the minibatch's ``ref_per_token_logps``. Where TRL
  computes no pi_old (one minibatch, one epoch: the policy *is* pi_old at the loss) k3 and its
  gradient are exactly 0, and the term is left out (``beta`` reads 0 for that call).

Measurements (``take_step``: the totals since the last call, one RL step):

* ``time/rollout``: TRL's ``_generate``; ``time/reward``: its ``_calculate_rewards``;
* ``time/old_logprob``: TRL's no-grad forwards of the policy while scoring a batch (pi_old; 0 when
  TRL computes none); ``score``: the whole of ``_generate_and_score_completions``;
* ``ref_in_loss``: A0's reference forwards inside the loss (seconds), so the update's time can
  leave them out as native charges them to ``ref_logprob``;
* ``kl/old``: k3 of the policy being updated to pi_old on each minibatch's tokens (the log-probs TRL's
  loss computed, no extra forward), the bench's diagnostic mean (``diagnostic_agg(loss_agg)``),
  averaged over the RL step's optimizer steps — native's definition.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import use_adapter

from prorl_bench.config import LossAgg
from prorl_bench.engines.trl.config_map import REF_SOURCES
from prorl_bench.rl.losses import diagnostic_agg
from prorl_bench.run.kl_measure import mean_kl

TIMED = ("rollout", "reward", "old_logprob", "score", "ref_in_loss")


class BenchGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with the bench's reference source and stage measurements (module docstring).

    ``ref_source``: one of ``REF_SOURCES``; ``kl_beta``: the KL coefficient for ``old`` (TRL is built
    with ``args.beta=0`` so that it loads no reference model); ``loss_agg``: the bench's aggregation,
    for ``kl/old``'s diagnostic mean."""

    def __init__(self, *args: Any, ref_source: str = "cached", kl_beta: float = 0.0,
                 loss_agg: LossAgg = LossAgg.token, **kwargs: Any) -> None:  # fmt: skip
        if ref_source not in REF_SOURCES:
            raise ValueError(f"ref_source={ref_source!r}: one of {REF_SOURCES}")
        super().__init__(*args, **kwargs)
        if ref_source == "old":
            if self.args.beta != 0.0 or kl_beta <= 0.0:
                raise ValueError("ref_source='old' needs GRPOConfig(beta=0) (no reference model) and kl_beta > 0")
            self.beta = kl_beta  # read by _compute_loss only; the scoring pass sees 0 (no reference to run)
        self.ref_source = ref_source
        self.diag_agg = diagnostic_agg(loss_agg)
        self._seconds = dict.fromkeys(TIMED, 0.0)
        self._kl_old: list[float] = []
        self._scoring = False
        self._last_logps: torch.Tensor | None = None

    # ------------------------------------------------------------------ the reference source

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        beta = self.beta
        if self.ref_source != "cached":
            self.beta = 0.0  # TRL reads beta here only to run its per-batch reference pass: A0 / B run none
        t0, self._scoring = time.perf_counter(), True
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self.beta, self._scoring = beta, False
            self._seconds["score"] += time.perf_counter() - t0

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        beta = self.beta
        if self.ref_source == "recompute" and beta != 0.0:
            inputs = {**inputs, "ref_per_token_logps": self._reference_logps(inputs)}
        elif self.ref_source == "old":
            if "old_per_token_logps" in inputs:
                inputs = {**inputs, "ref_per_token_logps": inputs["old_per_token_logps"]}
            else:
                self.beta = 0.0  # the policy is pi_old here: k3 = 0 and its gradient 0, exactly
        self._last_logps = None
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self.beta = beta
        self._record_kl_old(inputs)
        return loss

    @torch.no_grad()
    def _reference_logps(self, inputs: dict[str, Any]) -> torch.Tensor:
        """A0: the minibatch's reference log-probs, (B, T), on the reference TRL itself would use."""
        t0 = time.perf_counter()
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        keep = inputs["completion_ids"].size(1)
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            if self.ref_model is not None:
                logps = self._get_per_token_logps_and_entropies(self.ref_model, ids, mask, keep)[0]
            else:  # PEFT: TRL's reference is the policy with adapters disabled, or its "ref" adapter
                peft = self.accelerator.unwrap_model(self.model)
                with use_adapter(peft, adapter_name="ref" if "ref" in peft.peft_config else None):
                    logps = self._get_per_token_logps_and_entropies(self.model, ids, mask, keep)[0]
        self._seconds["ref_in_loss"] += time.perf_counter() - t0
        return logps

    # ------------------------------------------------------------------ measurements around TRL's methods

    def _generate(self, prompts: list) -> Any:
        t0 = time.perf_counter()
        try:
            return super()._generate(prompts)
        finally:
            self._seconds["rollout"] += time.perf_counter() - t0

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        finally:
            self._seconds["reward"] += time.perf_counter() - t0

    def _get_per_token_logps_and_entropies(self, model: Any, *args: Any, **kwargs: Any) -> Any:
        policy_pass = model is not self.ref_model
        timed = self._scoring and policy_pass and not self._peft_reference_pass()
        t0 = time.perf_counter()
        out = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
        if timed:
            self._seconds["old_logprob"] += time.perf_counter() - t0
        if policy_pass and torch.is_grad_enabled():
            self._last_logps = out[0]  # the loss's own forward: kl/old reads it, no extra pass
        return out

    def _peft_reference_pass(self) -> bool:
        """True while a PEFT policy runs as TRL's reference (adapters disabled or ``ref`` active)."""
        if self.ref_model is not None or self.beta == 0.0:
            return False
        peft = self.accelerator.unwrap_model(self.model)
        if getattr(peft, "active_adapter", None) == "ref":
            return True
        layer = next((m for m in peft.modules() if hasattr(m, "disable_adapters") and hasattr(m, "lora_A")), None)
        return bool(layer is not None and layer.disable_adapters)

    def _record_kl_old(self, inputs: dict[str, Any]) -> None:
        logp = self._last_logps
        if logp is None:
            return
        old = inputs.get("old_per_token_logps")
        old = logp if old is None else old  # TRL's own rule: no pi_old pass means the policy is pi_old
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        self._kl_old.append(float(mean_kl("k3", logp.detach(), old, mask, self.diag_agg)))

    def take_step(self) -> dict[str, float]:
        """The measurements since the last call (seconds per ``TIMED`` stage; ``kl/old``: the mean over
        the optimizer steps, NaN if none ran), and start over."""
        out = dict(self._seconds)
        out["kl/old"] = sum(self._kl_old) / len(self._kl_old) if self._kl_old else float("nan")
        self._seconds = dict.fromkeys(TIMED, 0.0)
        self._kl_old = []
        return out

"""``reset.source=best``: the best held-out policy so far, kept in memory for the next reset (ProRL v2
refreshes the reference from the best-performing checkpoint).

``BestPolicy.observe`` is called after every *regular* held-out evaluation (``step % eval_every == 0``;
not the base's at step 0, not the end-of-run one: extending a finished run must not change its
trajectory, as for the stall trigger). A strictly higher pass@1 replaces the snapshot, so ties keep the
**earliest** evaluation. The snapshot is the policy's trainable parameters, cloned on their device:
frozen parameters (a LoRA policy's base) and buffers never change during a run, so a reset takes them
from the current policy and the reference equals the policy of that evaluation bit for bit. The
snapshot, its step and score are checkpointed (``RunState.state_dict``), so a resumed run resets to the
same weights as an uninterrupted one.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class BestPolicy:
    """The policy's trainable weights at the regular evaluation with the highest pass@1 so far."""

    def __init__(self) -> None:
        self.step: int | None = None  # the evaluation's step (None: no evaluation yet)
        self.score: float | None = None  # its held-out pass@1
        self.weights: dict[str, torch.Tensor] | None = None  # trainable parameter name -> clone

    @property
    def exists(self) -> bool:
        return self.weights is not None

    @torch.no_grad()
    def observe(self, step: int, score: float, policy: torch.nn.Module) -> bool:
        """One regular evaluation of ``policy`` at ``step`` scoring ``score`` (pass@1); True when it
        became the best (strictly higher than the best so far: ties keep the earliest)."""
        if not math.isfinite(score):
            raise ValueError(f"reset.source=best: held-out pass@1 at step {step} is {score} (not finite)")
        if self.score is not None and not score > self.score:
            return False
        self.step, self.score = int(step), float(score)
        self.weights = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
        return True

    def weights_for(self, policy: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The snapshot, checked against ``policy``'s trainable parameters now (names and shapes): a
        mismatch (a grown adapter) raises instead of resetting to the wrong weights."""
        if self.weights is None:
            raise RuntimeError("reset.source=best: no held-out evaluation has been recorded yet")
        now = {n: p for n, p in policy.named_parameters() if p.requires_grad}
        if now.keys() != self.weights.keys():
            diff = sorted(set(now) ^ set(self.weights))[:5]
            raise ValueError(f"reset.source=best: the best snapshot (step {self.step}) and the policy differ in {diff}")
        for n, p in now.items():
            if p.shape != self.weights[n].shape:
                raise ValueError(
                    f"reset.source=best: {n} has shape {tuple(p.shape)}, the best snapshot (step {self.step}) "
                    f"{tuple(self.weights[n].shape)}"
                )
        return self.weights

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "score": self.score, "weights": self.weights}

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None) -> None:
        """Restore from a checkpoint (loaded on CPU: ``device`` moves the weights back)."""
        self.step, self.score = state["step"], state["score"]
        w = state["weights"]
        self.weights = None if w is None else {n: t.to(device) if device is not None else t for n, t in w.items()}

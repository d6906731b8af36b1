"""``StepMeter``: what one RL step of a TRL run does to the weights and how long its optimizer steps
take, measured from outside TRL (a ``TrainerCallback``; no TRL code is copied).

* ``update_norm``: the L2 norm of the RL step's parameter change, all its optimizer steps together
  (native's definition, ``run/phases.py``): the bench's ``ParamSnapshot`` of the trainable weights at
  the RL step's first ``on_step_begin`` (``hardware.update_norm`` says where the copy lives; ``off``:
  NaN), compared at its last ``on_step_end`` — before any reset, which moves the reference only.
* ``seconds``: wall time from each ``on_step_begin`` to its ``on_step_end`` (the batch's scoring when
  TRL generates, the forwards, backwards, clipping and AdamW steps), summed over the RL step.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from transformers import TrainerCallback

from prorl_bench.config import UpdateNormMode
from prorl_bench.rl.optim import ParamSnapshot


class StepMeter(TrainerCallback):
    """Per-RL-step ``update_norm`` and optimizer-step seconds of ``model`` (``per``: optimizer steps
    per RL step). ``take()`` returns them and starts the next RL step's."""

    def __init__(self, model: torch.nn.Module, per: int, mode: UpdateNormMode | str = UpdateNormMode.auto) -> None:
        self.model, self.per, self.mode = model, per, mode
        self._snapshot: ParamSnapshot | None = None
        self.update_norm = math.nan
        self.seconds, self._t0 = 0.0, 0.0

    def _trainable(self) -> list[torch.Tensor]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step % self.per == 0:  # an RL step starts
            self._snapshot = ParamSnapshot(self._trainable(), self.mode)
        self._t0 = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.seconds += time.perf_counter() - self._t0
        if state.global_step % self.per == 0 and self._snapshot is not None:
            self.update_norm = self._snapshot.norm(self._trainable())
            self._snapshot = None

    def take(self) -> tuple[float, float]:
        """(update_norm, seconds) of the RL step that just ended; NaN norm if none was measured."""
        out = (self.update_norm, self.seconds)
        self.update_norm, self.seconds = math.nan, 0.0
        return out

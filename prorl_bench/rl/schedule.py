"""Learning-rate schedule: constant after a linear warm-up, restartable at resets.

lr(step) = lr * min(1, (step - start + 1) / warmup). A hard optimizer reset restarts the schedule
(as a fresh optimizer + scheduler would); any reset may ask for a re-warm-up over N steps
(ReLoRA re-warms for 50-100 steps after resetting moments).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LRSchedule:
    base_lr: float
    warmup: int = 0
    start: int = 1  # first step of the current (re)start

    def factor(self, step: int) -> float:
        if self.warmup <= 0:
            return 1.0
        return min(1.0, (step - self.start + 1) / self.warmup)

    def lr(self, step: int) -> float:
        return self.base_lr * self.factor(step)

    def restart(self, next_step: int, warmup: int) -> None:
        self.start, self.warmup = next_step, warmup

"""KL coefficient control: fixed, or adaptive toward a target KL (Ziegler et al. 2019; verl).

Adaptive update after each step with measured KL k (nats per token):
    e = clip(k / target - 1, -0.2, 0.2);   beta <- clip(beta * (1 + e / horizon), beta_min, beta_max)
so beta rises when KL is above target, falls below it, and moves at most 20%/horizon per step.
"""

from __future__ import annotations

import math

from prorl_bench.config import AdaptiveKLParams


class KLController:
    def __init__(self, init_beta: float, cfg: AdaptiveKLParams | None) -> None:
        """``cfg``: kl_ctl=adaptive's parameters; None (kl_ctl=fixed) keeps beta at ``init_beta``."""
        self.init_beta = init_beta
        self.cfg = cfg
        self.value = init_beta

    def update(self, kl: float | None) -> float:
        """Feed the step's measured KL; returns the beta for the next step. None/NaN KL: no change."""
        if self.cfg is None or kl is None or math.isnan(kl):
            return self.value
        err = min(max(kl / self.cfg.target - 1.0, -0.2), 0.2)
        self.value = min(max(self.value * (1.0 + err / self.cfg.horizon), self.cfg.beta_min), self.cfg.beta_max)
        return self.value

    def restore(self) -> None:
        self.value = self.init_beta

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])

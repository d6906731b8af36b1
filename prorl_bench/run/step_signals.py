"""What the phases of one step tell each other: small typed signals, never the metrics row.

The decisions at the step boundary read these (the reset trigger and the KL controller read
``KLStats``; growth reads ``ResetDecision``); ``diagnostics.metrics_row`` builds the logged row from
them last, so the log is an output of the step and no decision depends on a logged key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class KLStats:
    """The step's KL figures (nats per token, aggregated as the diagnostics aggregate; NaN where
    undefined): to the reference with the configured estimator (``ref``; NaN without a reference or
    with no trained row), its unbiased k1 estimate (``ref_k1``), the ProRL v2 blog formula
    (``k2_ref_over_old``), the mean k3 KL of each minibatch's policy to pi_old (``old``) and the KL to
    the initial base (``base``: ``ref`` while the reference is the base, else measured at validation)."""

    ref: float
    ref_k1: float
    k2_ref_over_old: float
    old: float
    base: float

    def for_controller(self, has_reference: bool) -> float:
        """The KL the adaptive controller and the KL triggers follow: to the reference, or to pi_old (B)."""
        return self.ref if has_reference else self.old


@dataclass(frozen=True)
class ResetDecision:
    """Whether the reference was reset at this step's end, and the trigger's reason."""

    reason: str | None = None

    @property
    def happened(self) -> bool:
        return self.reason is not None


@dataclass(frozen=True)
class GrowthDecision:
    """Whether the adapter rank grew at this step's end (and why); ``rank`` after it (None: no LoRA)."""

    reason: str | None = None
    rank: int | None = None

    @property
    def happened(self) -> bool:
        return self.reason is not None


NAN = math.nan

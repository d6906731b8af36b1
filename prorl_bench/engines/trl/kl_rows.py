"""``KLRows``: the log-probs TRL's loss already holds for one RL step — pi_old's and the reference's
of every sampled token, and the completion mask — kept so that the KL to the reference is measured
by the same function as native's (``run/kl_measure.reference_kl``), over every process's rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class KLRows:
    """Rows (B, L) of pi_old's and the reference's log-probs with their mask, on the CPU."""

    def __init__(self) -> None:
        self.parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def add(self, logp_old: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor) -> None:
        self.parts.append(tuple(t.detach().to("cpu") for t in (logp_old, logp_ref, mask)))  # type: ignore[arg-type]

    def gathered(self, gather: Callable[[list[Any]], list[Any]]) -> KLRows:
        """Every process's rows (``gather``: all processes' lists, rank order), so every process takes
        the same reset decision."""
        out = KLRows()
        out.parts = list(gather(self.parts))
        return out

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(logp_old, logp_ref, mask) of all rows, right-padded with masked zeros to the widest
        (processes pad their batches separately); None when there is none. Masked positions weigh
        nothing in the diagnostic means (token, sequence)."""
        if not self.parts:
            return None
        width = max(p[0].shape[1] for p in self.parts)

        def cat(i: int) -> torch.Tensor:
            return torch.cat([torch.nn.functional.pad(p[i], (0, width - p[i].shape[1])) for p in self.parts])

        return cat(0), cat(1), cat(2)

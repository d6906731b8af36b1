"""engine=trl: TRL's GRPOTrainer built from the bench's config (docs/engines.md), and
``ReferenceResetCallback`` — the bench's reset semantics for any TRL script."""

from __future__ import annotations

from typing import Any

__all__ = ["ReferenceResetCallback"]


def __getattr__(name: str) -> Any:  # transformers is imported only when the callback is asked for
    if name == "ReferenceResetCallback":
        from prorl_bench.engines.trl.callback import ReferenceResetCallback

        return ReferenceResetCallback
    raise AttributeError(name)

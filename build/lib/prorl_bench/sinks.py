"""Optional experiment-tracking sinks beside the JSONL files: TensorBoard and Weights & Biases (offline).

Both are off by default (``tracking.tensorboard`` / ``tracking.wandb``) and live in optional extras
(``pip install 'prorl-bench[tensorboard]'`` / ``'prorl-bench[wandb]'``). The JSONL files stay the
source of truth: a sink receives the same rows the ``RunWriter`` writes, nothing more.

* TensorBoard: scalars under ``RUN_DIR/tensorboard`` (x axis = RL step), events as text.
* W&B: ``wandb.init(mode="offline", dir=RUN_DIR)`` — nothing leaves the machine; ``wandb sync`` later.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

from prorl_bench.config import Config
from prorl_bench.extras import require_extra
from prorl_bench.outputs import RunWriter


class Sink(Protocol):
    def metrics(self, row: dict[str, Any]) -> None: ...
    def event(self, row: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def _scalars(row: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


class TensorBoardSink:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def metrics(self, row: dict[str, Any]) -> None:
        for k, v in _scalars(row).items():
            self.writer.add_scalar(k, v, global_step=int(row["step"]))

    def event(self, row: dict[str, Any]) -> None:
        self.writer.add_text(f"events/{row['event']}", json.dumps(row, default=str), global_step=int(row["step"]))

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, cfg: Config) -> None:
        import wandb
        from omegaconf import OmegaConf

        self.wandb = wandb
        self.run = wandb.init(
            project=cfg.tracking.wandb_project,
            mode="offline",
            dir=str(run_dir),
            name=Path(run_dir).name,
            config=OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True),
            reinit="finish_previous",
        )

    def metrics(self, row: dict[str, Any]) -> None:
        self.run.log(_scalars(row), step=int(row["step"]))

    def event(self, row: dict[str, Any]) -> None:
        # same step as the metrics row just logged (W&B steps must not go backwards)
        self.run.log({f"events/{row['event']}": 1.0}, step=max(int(row["step"]), self.run.step), commit=False)

    def close(self) -> None:
        self.run.finish()


class TeeWriter(RunWriter):
    """A ``RunWriter`` that also forwards metrics rows and events to the sinks."""

    def __init__(self, run_dir: Path, sinks: list[Sink]) -> None:
        super().__init__(run_dir)
        self.sinks = sinks

    def metrics(self, row: dict[str, Any]) -> None:
        super().metrics(row)
        for s in self.sinks:
            s.metrics(row)

    def event(self, step: int, event: str, reason: str, **details: Any) -> None:
        super().event(step, event, reason, **details)
        for s in self.sinks:
            s.event({"step": step, "event": event, "reason": reason, **details})

    def close(self) -> None:
        super().close()
        for s in self.sinks:
            s.close()


def open_writer(cfg: Config, run_dir: Path) -> RunWriter:
    """The run's writer: plain JSONL, or JSONL plus the enabled tracking sinks."""
    sinks: list[Sink] = []
    if cfg.tracking.tensorboard:
        require_extra("tensorboard", "tracking.tensorboard=true", "tensorboard")
        sinks.append(TensorBoardSink(run_dir))
    if cfg.tracking.wandb:
        require_extra("wandb", "tracking.wandb=true", "wandb")
        sinks.append(WandbSink(run_dir, cfg))
    return TeeWriter(run_dir, sinks) if sinks else RunWriter(run_dir)

"""Optional experiment-tracking sinks beside the JSONL files: TensorBoard and Weights & Biases (offline).

Both are off by default (``tracking.tensorboard`` / ``tracking.wandb``) and live in optional extras
(``pip install 'prorl-bench[tensorboard]'`` / ``'prorl-bench[wandb]'``). The JSONL files stay the
source of truth: a sink receives the same rows the ``RunWriter`` writes — every metrics row
(``metrics.jsonl``) and every validation row (``validation.jsonl``: ``val/pass@k`` and the rest) — with
every key (``step`` is the x axis). A non-finite value (JSON ``null``) is logged as NaN, so each
tracker holds exactly the keys of the JSONL files (``tests/run/test_sinks.py`` checks the three sets).

* TensorBoard: scalars under ``RUN_DIR/tensorboard`` (x axis = RL step), events as text.
* W&B: ``wandb.init(mode="offline", dir=RUN_DIR)`` — nothing leaves the machine; ``wandb sync`` later.
  A validation row at step k and the metrics row of step k land in W&B's history row k.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

from prorl_bench.config import Config
from prorl_bench.extras import require_extra
from prorl_bench.run.outputs import RunWriter


class Sink(Protocol):
    def metrics(self, row: dict[str, Any]) -> None: ...
    def validation(self, row: dict[str, Any]) -> None: ...
    def event(self, row: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def _scalars(row: dict[str, Any]) -> dict[str, float]:
    """Every key but ``step`` as a float: numbers (bools as 0/1) as they are, None and non-finite
    values as NaN (a missing value, never a dropped key). A value that is not a number is an error:
    a tracker would silently lose it."""
    out = {}
    for k, v in row.items():
        if k == "step":
            continue
        if v is not None and not isinstance(v, (int, float)):
            raise TypeError(f"tracking sink: key {k!r} has a {type(v).__name__} value {v!r}; rows must hold numbers")
        out[k] = float(v) if v is not None and math.isfinite(v) else math.nan
    return out


class TensorBoardSink:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def metrics(self, row: dict[str, Any]) -> None:
        for k, v in _scalars(row).items():
            self.writer.add_scalar(k, v, global_step=int(row["step"]))

    validation = metrics  # keys are already distinct (val/...); the x axis is the RL step

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

    validation = metrics  # logged before the metrics row of its step: both merge into W&B's row k

    def event(self, row: dict[str, Any]) -> None:
        # same step as the metrics row just logged (W&B steps must not go backwards)
        self.run.log({f"events/{row['event']}": 1.0}, step=max(int(row["step"]), self.run.step), commit=False)

    def close(self) -> None:
        self.run.finish()
        # W&B writes the offline record log in its own service process, which was seen (twice in CI, under
        # load) to lag finish(): the .wandb file held its header only. Shutting the service down waits
        # for it to flush and exit; the next run's wandb.init starts a fresh one.
        self.wandb.teardown()


class TeeWriter(RunWriter):
    """A ``RunWriter`` that also forwards metrics rows, validation rows and events to the sinks."""

    def __init__(self, run_dir: Path, sinks: list[Sink]) -> None:
        super().__init__(run_dir)
        self.sinks = sinks

    def metrics(self, row: dict[str, Any]) -> None:
        super().metrics(row)
        for s in self.sinks:
            s.metrics(row)

    def validation(self, row: dict[str, Any]) -> None:
        super().validation(row)
        for s in self.sinks:
            s.validation(row)

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

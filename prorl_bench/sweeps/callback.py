"""The Hydra callback that tables a multirun when it ends (registered in ``conf/config.yaml``).

Kept apart from ``aggregate.py`` on purpose: Hydra instantiates its callbacks in every process that
composes the config — each single run and each sweep worker — and importing the aggregator there
(pandas, scipy.stats) cost about 1.6 s of start-up per training process. The aggregator is imported
only when a multirun ends.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from prorl_bench.config.metric_catalog import DEFAULT_THRESHOLD, DEFAULT_WINDOW

SWEEP_DIR_FILE_ENV = "PRORL_BENCH_SWEEP_DIR_FILE"  # prorl-bench-sweep learns the sweep dir through it


class AggregateCallback(Callback):
    """Hydra callback: note the sweep dir at multirun start, aggregate and print at multirun end.

    Hydra does not call ``on_multirun_end`` when a job failed; ``prorl-bench-sweep`` then runs the
    aggregation itself, using the directory recorded here.
    """

    def __init__(
        self,
        threshold: float = DEFAULT_THRESHOLD,
        window: int = DEFAULT_WINDOW,
        figures: bool = True,
        baseline: str | None = None,
    ):
        self.threshold, self.window, self.figures, self.baseline = threshold, window, figures, baseline

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from prorl_bench.run.signals import stop_sweep_on_signals

        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        stop_sweep_on_signals(sweep_dir)  # SIGTERM/SIGINT stop the sweep cleanly, table included
        target = os.environ.get(SWEEP_DIR_FILE_ENV)
        if target:
            Path(target).write_text(str(sweep_dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from prorl_bench.sweeps.aggregate import aggregate, print_result

        res = aggregate(
            config.hydra.sweep.dir,
            threshold=self.threshold,
            window=self.window,
            figures=self.figures,
            baseline=self.baseline,
            strict_baseline=False,  # a grid narrowed on the command line may not contain it
        )
        print_result(res)

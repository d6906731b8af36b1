"""``checkpoint``, ``guard``, ``export``, ``tracking`` and ``eval``: how a run saves, guards, exports,
logs and evaluates (the run's machinery is prorl_bench/run/)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prorl_bench import registry
from prorl_bench.config.enums import NonFinitePolicy

_require = registry.require  # ConfigError "invalid config value key=value: allowed ..." unless ok


@dataclass
class CheckpointConfig:
    every: int = 50  # steps between checkpoints; 0 disables (a preemption signal still checkpoints)
    keep_last: int = 2  # checkpoints kept on disk (older ones deleted)

    def __post_init__(self) -> None:
        _require(self.every >= 0, "checkpoint.every", self.every, ">= 0 (0 disables)")
        _require(self.keep_last >= 1, "checkpoint.keep_last", self.keep_last, ">= 1")


@dataclass
class GuardConfig:
    nonfinite: NonFinitePolicy = NonFinitePolicy.fail  # fail | skip_batch on NaN/inf (see NonFinitePolicy)


@dataclass
class ExportConfig:
    """``at_end``: export the final policy to ``<run_dir>/export`` (format: prorl_bench/run/export.py)."""

    at_end: bool = False  # export the final policy to <run_dir>/export


@dataclass
class TrackingConfig:
    """Optional sinks beside the JSONL files (see prorl_bench/run/sinks.py); both need an extra."""

    tensorboard: bool = False  # scalars under RUN_DIR/tensorboard
    wandb: bool = False  # Weights & Biases, always offline (files under RUN_DIR/wandb)
    wandb_project: str = "prorl-bench"  # W&B project name (offline)


@dataclass
class EvalConfig:
    """Held-out evaluation (every ``eval_every`` steps, at the end, and of the base at step 0).

    ``n_samples`` samples per held-out prompt give unbiased pass@k for every k in ``ks`` (Chen et al.
    2021) and the per-prompt diversity; ``n_sample_prompts`` prompts are written with all their
    samples to ``samples.jsonl``; ``batch`` sequences are generated per call (memory vs speed).
    """

    n_samples: int = 16  # samples per held-out prompt (pass@k needs k <= n_samples)
    # k values of val/pass@k (Chen et al. 2021 unbiased estimator)
    ks: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    n_sample_prompts: int = 8  # prompts written with their samples to samples.jsonl (base and final step: all)
    batch: int = 512  # sequences generated per call during evaluation (memory vs speed)
    at_start: bool = True  # evaluate the base policy at step 0 (every run carries its own "before")
    # samples per held-out prompt at the two endpoints only (the base at step 0, the final step); null: n_samples.
    # Large k at the ends, a cheap curve between them (issue 43: pass@256 against the base)
    endpoint_n_samples: int | None = None
    endpoint_ks: list[int] | None = None  # the k values at the two endpoints; null: ks

    def __post_init__(self) -> None:
        _require(self.n_samples >= 1, "eval.n_samples", self.n_samples, ">= 1")
        _require(len(self.ks) >= 1, "eval.ks", self.ks, "a non-empty list")
        bad = [k for k in self.ks if not 1 <= k <= self.n_samples]
        _require(not bad, "eval.ks", self.ks, f"values in [1, eval.n_samples={self.n_samples}]")
        _require(len(set(self.ks)) == len(self.ks), "eval.ks", self.ks, "distinct values")
        _require(self.n_sample_prompts >= 0, "eval.n_sample_prompts", self.n_sample_prompts, ">= 0")
        _require(self.batch >= 1, "eval.batch", self.batch, ">= 1")
        n_end = self.endpoint_n_samples if self.endpoint_n_samples is not None else self.n_samples
        _require(n_end >= 1, "eval.endpoint_n_samples", self.endpoint_n_samples, ">= 1 (or null: eval.n_samples)")
        if self.endpoint_ks is not None:
            bad = [k for k in self.endpoint_ks if not 1 <= k <= n_end]
            _require(len(self.endpoint_ks) >= 1 and not bad, "eval.endpoint_ks", self.endpoint_ks,
                     f"a non-empty list of values in [1, {n_end}] (the endpoint samples per prompt)")  # fmt: skip
            _require(len(set(self.endpoint_ks)) == len(self.endpoint_ks), "eval.endpoint_ks", self.endpoint_ks,
                     "distinct values")  # fmt: skip
        elif self.endpoint_n_samples is not None:
            bad = [k for k in self.ks if k > n_end]
            _require(
                not bad, "eval.ks", self.ks, f"values <= eval.endpoint_n_samples={n_end} (or set eval.endpoint_ks)"
            )

    def at(self, step: int, steps: int) -> tuple[int, list[int]]:
        """(samples per prompt, ks) of the evaluation at ``step`` of a ``steps``-step run."""
        if step in (0, steps):
            n = self.endpoint_n_samples if self.endpoint_n_samples is not None else self.n_samples
            return n, list(self.endpoint_ks if self.endpoint_ks is not None else self.ks)
        return self.n_samples, list(self.ks)

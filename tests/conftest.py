"""Shared fixtures: compose configs from conf/ exactly as the CLI does, and run tiny experiments."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from prorl_bench.cli.app import CONF_DIR
from prorl_bench.cli.option_code import load_option_code
from prorl_bench.config import Config, register_configs, to_config

register_configs()
# as the command line does before it validates (prorl_bench/cli/option_code.py): the config checks that
# live with an option's code (a task's own, engine=trl's refusals) run in make_config too, whatever
# test ran first in this worker
load_option_code()
importlib.import_module("prorl_bench.rl")  # every RL option's code registered: tests look options up directly

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests may reach a model hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Small but real: a few RL steps from a quickly warmed-up base. Used by most trainer tests.
FAST = [
    "steps=6",
    "eval_every=3",
    "algo.prompts_per_step=4",
    "algo.group_size=4",
    "warmup.target_success=0.05",
    "task.val_size=16",
]


TIMING_PREFIXES = ("time/", "throughput/", "perf/flops_per_s", "perf/mfu", "mem/")  # mem/rss_mb: per process


def strip_timing(rows: list[dict]) -> list[dict]:
    """Metrics rows without wall-clock fields (what must be identical across equivalent runs)."""
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]


def compose_cfg(overrides: list[str] | None = None):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides or []))


def make_config(overrides: list[str] | None = None) -> Config:
    return to_config(compose_cfg(overrides))


@pytest.fixture(scope="session")
def base_cache(tmp_path_factory) -> Path:
    """One warm-up cache for the whole test session (bases are keyed by their config).

    Under pytest-xdist the workers share it (the directory above their own temp dirs): a base's file
    lock (prorl_bench/run/base.py) lets the first worker that needs a base train it while the others
    wait, so no base is trained twice."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "base_cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("base_cache")


@pytest.fixture
def run_exp(tmp_path, base_cache):
    """run_exp(overrides, name) -> (summary, run_dir): a real training run through trainer.train."""
    from prorl_bench.run.trainer import train

    def _run(overrides: list[str], name: str = "run"):
        cfg = make_config(FAST + list(overrides))
        run_dir = tmp_path / name
        return train(cfg, run_dir, base_cache, threads=1), run_dir

    return _run


# --------------------------------------------------------------------------- tiny local HF checkpoints
# Nothing is downloaded: a LLaMA-architecture model with random weights and a char WordPiece
# tokenizer are built in a temp dir once per session (prorl_bench/models/tiny_hf.py).


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory) -> Path:
    """A ~60k-parameter LLaMA (grouped-query attention) whose tokenizer has *no* pad token."""
    pytest.importorskip("transformers")
    from prorl_bench.models.tiny_hf import build_tiny_llama

    return build_tiny_llama(
        tmp_path_factory.mktemp("hf") / "nopad", hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, with_pad=False
    )


@pytest.fixture(scope="session")
def tiny_hf_dir_pad(tmp_path_factory) -> Path:
    """As tiny_hf_dir, with a dedicated pad token and full multi-head attention."""
    pytest.importorskip("transformers")
    from prorl_bench.models.tiny_hf import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("hf") / "pad", hidden_size=32, n_layers=2, n_heads=4, with_pad=True)

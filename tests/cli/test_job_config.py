"""``prorl-bench --cfg job`` shows the config the run will use: each axis's section holds the selected
option's parameters only (as ``config_resolved.yaml`` does), while a sweep over options with another
option's parameter on the same line (``reset=none,periodic reset.every=25``) still composes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from prorl_bench.config import complete
from prorl_bench.run import provenance
from tests.conftest import FAST, compose_cfg

EXE = str(Path(sys.executable).with_name("prorl-bench"))
SWEEP_EXE = str(Path(sys.executable).with_name("prorl-bench-sweep"))
# every reset trigger's own parameter keys (rl/resets.py's dataclasses): none may show unless selected
RESET_PARAMS = {"every", "kl_threshold", "kl_multiple", "kl_ema", "kl_warmup", "patience", "min_delta"}


def _cfg_job(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, "--cfg", "job", *overrides], cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "overrides,params",
    [
        (["reset=none"], set()),
        (["variant=C", "reset=periodic", "reset.every=7"], {"every"}),
        (["variant=C", "reset=kl_spike"], {"kl_threshold", "kl_multiple", "kl_ema", "kl_warmup"}),
    ],
)
def test_cfg_job_shows_only_the_selected_options_parameters(tmp_path, overrides, params):
    proc = _cfg_job(tmp_path, *overrides)
    assert proc.returncode == 0, proc.stderr
    shown = yaml.safe_load(proc.stdout)
    assert set(shown["reset"]) & RESET_PARAMS == params
    assert "hydra" not in shown  # the job's config, as Hydra's --cfg job
    # exactly what the run records (config.complete), key order included
    assert proc.stdout == OmegaConf.to_yaml(complete(compose_cfg(overrides)))


def test_cfg_job_of_an_invalid_line_is_the_runs_config_error(tmp_path):
    proc = _cfg_job(tmp_path, "reset=periodic")  # resets need variant C
    assert proc.returncode == 2 and "config error" in proc.stderr and "reset" in proc.stderr
    assert proc.stdout == ""


def test_other_cfg_requests_are_hydras(tmp_path):
    proc = subprocess.run([EXE, "--cfg", "hydra"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("hydra:"), proc.stderr


def test_a_sweep_over_options_with_one_options_parameter_still_composes(tmp_path):
    """Hydra's base keeps the built-ins' parameter keys (with no value: the selected option's default
    applies), so ``reset.every=25`` is valid in the job that selects ``reset=none`` too
    (docs/configuration.md's command); each job's record drops it."""
    line = ["variant=C", "reset=none,periodic", "reset.every=25", "seed=0"]
    proc = subprocess.run([SWEEP_EXE, *line, "--dry-run"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "2 jobs, all valid" in proc.stdout
    for reset, every in (("none", None), ("periodic", 25)):
        job = complete(compose_cfg(["variant=C", f"reset={reset}", "reset.every=25"]))
        assert job.reset.get("every") == every


@pytest.mark.slow  # one short run through the entry point (~10-30 s loaded)
def test_cfg_job_equals_the_runs_config_resolved_yaml(tmp_path, base_cache):
    line = [*FAST, "steps=2", "variant=C", "reset=periodic", "reset.every=2", "progress=false"]
    line += [f"warmup.cache_dir={base_cache}", f"run_dir={tmp_path / 'run'}", "hardware.torch_threads=1"]
    shown = subprocess.run([EXE, "--cfg", "job", "--resolve", *line], cwd=tmp_path, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    run = subprocess.run([EXE, *line], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    recorded = provenance.config_only((tmp_path / "run" / "config_resolved.yaml").read_text())
    assert shown.stdout == recorded

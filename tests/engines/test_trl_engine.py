"""engine=trl end to end: refusals before anything runs, the mapping table generated from the rules,
one run directory for both engines (files, keys, resume), a grid through the SLURM code path
(submitit_local) aggregated with the same columns as a native grid, and variant B without a
reference model. Entry points are started from a temporary directory, as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from prorl_bench.config import to_config
from prorl_bench.engines.trl import config_map
from prorl_bench.searchpath import ROOT
from tests.conftest import compose_cfg

pytest.importorskip("trl")

BIN = Path(sys.executable).parent
HANG_S = 1800  # a hang guard only (a loaded 2-core machine), never a deadline
# a few quick steps on the tiny HF model: 4 prompts x 4 samples, 2 minibatches x 2 epochs per RL step
QUICK = ["steps=4", "eval_every=2", "algo.prompts_per_step=4", "algo.group_size=4", "task.val_size=8",
         "eval.n_samples=4", "eval.ks=[1,4]", "progress=false"]  # fmt: skip


def _cli(name: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONWARNINGS": "ignore",
                                                                         "OMP_NUM_THREADS": "1"}  # fmt: skip
    return subprocess.run([str(BIN / name), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_S)


def _hf(model_dir: Path) -> list[str]:
    return ["model=hf_causal_lm", f"model.path={model_dir}"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from prorl_bench.models.tiny_hf import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("trl_engine") / "tiny", hidden_size=32, n_layers=2, n_heads=4)


# --------------------------------------------------------------------------- the mapping, as data


def test_every_bench_key_maps_or_is_refused():
    """Each leaf key of the schema has a rule (its own or its group's): a new key cannot slip through
    engine=trl unmapped."""
    missing = [k for k in config_map.leaf_keys() if config_map.rule_for(k) is None]
    assert missing == []


def test_docs_table_is_generated_from_the_rules():
    text = (ROOT / "docs" / "engines.md").read_text()
    assert config_map.render_table() in text, "docs/engines.md is stale: python -m prorl_bench.engines.trl.docs"


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["variant=A0"], "variant.name"),
        (["variant=A2"], "variant.name"),
        (["variant=B"], "variant.name"),  # B with beta > 0: the bench's KL-to-old has no TRL term
        (["kl_estimator=k2"], "kl_estimator.name"),
        (["kl_estimator=k1", "kl_estimator.placement=reward"], "kl_estimator.placement"),
        (["adapter=lora", "growth=rank"], "growth.kind"),
        (["kl_ctl=adaptive"], "kl_ctl.kind"),
        (["algo=rloo"], "algo.advantage"),
        (["algo.dynamic_sampling=true"], "algo.dynamic_sampling"),
        (["model.impl=fast"], "model.impl"),
    ],
)
def test_refused_knobs_name_the_key(model_dir, overrides, key):
    with pytest.raises(Exception, match=f"engine=trl cannot run this config.*{key}"):
        to_config(compose_cfg(["engine=trl", *_hf(model_dir), *overrides]))


def test_what_trl_can_express_is_accepted(model_dir):
    base = ["engine=trl", *_hf(model_dir)]
    for extra in ([], ["variant=C", "reset=periodic", "opt_reset=hard"], ["variant=B", "algo.beta=0"],
                  ["adapter=lora", "adapter.targets=[q_proj,v_proj]"], ["algo=dr_grpo"]):  # fmt: skip
        cfg = to_config(compose_cfg(base + extra))
        assert config_map.refusals(cfg) == []
    assert cfg.algo.adv_eps == config_map.TRL_ADV_EPS  # engine=trl states TRL's hard-coded epsilon


def test_refusal_fails_fast_from_the_cli(tmp_path, model_dir):
    """Exit status 2, every refused key named with its reason, and nothing written (no run directory)."""
    proc = _cli("prorl-bench", ["engine=trl", *_hf(model_dir), "variant=A0", "kl_estimator=k2",
                                "adapter=lora", "growth=rank", "kl_ctl=adaptive"], tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    for key in ("variant.name", "kl_estimator.name", "growth.kind", "kl_ctl.kind"):
        assert key in proc.stderr
    assert "once per generation batch" in proc.stderr  # the reason, not only the key
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing was written


# --------------------------------------------------------------------------- one run directory contract


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_trl_run_writes_the_bench_run_directory_and_resumes(tmp_path, model_dir):
    run = tmp_path / "run"
    args = ["engine=trl", *_hf(model_dir), *QUICK, "variant=C", "reset=periodic", "reset.every=2", "opt_reset=hard",
            "checkpoint.every=2", f"run_dir={run}"]  # fmt: skip
    proc = _cli("prorl-bench", args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("config_resolved.yaml", "metrics.jsonl", "validation.jsonl", "events.jsonl", "samples.jsonl"):
        assert (run / name).is_file(), name
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    contract = {"step", "reward/mean", "reward/std", "success_rate", "kl/ref", "kl/old", "entropy", "loss/total",
                "loss/pg", "loss/kl", "clip_frac", "grad_norm", "lr", "response_len", "time/step", "time/ref_logprob",
                "count/ref_fwd", "tokens/ref_fwd", "reset"}  # fmt: skip
    assert contract <= set(rows[0])
    assert all(r["count/ref_fwd"] > 0 for r in rows)  # TRL's reference forwards, counted by hooks
    assert [r["reset"] for r in rows] == [0, 1, 0, 1]
    events = _rows(run / "events.jsonl")
    resets = [e for e in events if e["event"] == "reset"]
    assert [e["step"] for e in resets] == [2, 4] and resets[0]["opt_reset"] == "hard" and resets[0]["step_reset"]
    assert [v["step"] for v in _rows(run / "validation.jsonl")] == [0, 2, 4]  # at start, every 2, the end
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_completed"] == 4 and summary["engine"] == "trl"
    assert summary["reset_steps"] == [2, 4] and summary["mem/reference_mb"] > 0

    # resume: a copy whose last checkpoint and summary are gone continues from step 2
    again = tmp_path / "again"
    shutil.copytree(run, again)
    ckpts = sorted((again / "trl").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    shutil.rmtree(ckpts[-1])
    (again / "summary.json").unlink()
    proc = _cli("prorl-bench", [*args[:-1], f"run_dir={again}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = _rows(again / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # every step exactly once
    assert resumed[:2] == rows[:2]  # the checkpointed history is kept as written
    assert any(e["event"] == "resume" for e in _rows(again / "events.jsonl"))
    assert json.loads((again / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_variant_b_loads_no_reference_model(tmp_path, model_dir):
    """B on TRL: beta = 0, TRL builds no reference model; the summary holds 0 reference bytes and no
    reference forward is counted (A1 counts them: the test of the counter is in the run test)."""
    run = tmp_path / "b"
    proc = _cli("prorl-bench", ["engine=trl", *_hf(model_dir), *QUICK, "steps=2", "variant=B", "algo.beta=0",
                                f"run_dir={run}"], tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["mem/reference_mb"] == 0 and summary["objective"] == "trust_region_vs_old"
    assert all(r["count/ref_fwd"] == 0 for r in _rows(run / "metrics.jsonl"))


# --------------------------------------------------------------------------- grids on both engines


@pytest.mark.slow
def test_grid_on_both_engines_aggregates_to_the_same_table(tmp_path, model_dir):
    """One small grid per engine (TRL's through hydra/launcher=submitit_local: the SLURM code path),
    each aggregated by the normal aggregator: the same columns, every job completed."""
    grid = ["+arm=A1,C", "seed=0", *_hf(model_dir), *QUICK, "steps=2", "hydra.callbacks.aggregate.figures=false"]
    tables = {}
    for engine, launcher in (("trl", ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=30"]),
                             ("native", [])):  # fmt: skip
        sweep = tmp_path / engine
        proc = _cli("prorl-bench", ["-m", f"engine={engine}", *launcher, *grid, f"hydra.sweep.dir={sweep}"], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        if engine == "trl":
            assert (sweep / ".submitit").is_dir()
        tables[engine] = pd.read_csv(sweep / "aggregate" / "runs.csv")
        assert list(tables[engine]["status"]) == ["completed", "completed"]
        assert (tables[engine]["steps_logged"] == 2).all()
    assert list(tables["trl"].columns) == list(tables["native"].columns)
    assert list(tables["trl"]["group"]) == list(tables["native"]["group"])


# --------------------------------------------------------------------------- the README's TRL example


def _readme_example() -> tuple[str, str]:
    """(the shell command that builds the example's model, the example's Python) from the README's
    Engines section, as a user copies them."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Engines", 1)[1].split("\n## ", 1)[0]
    build = section.split("(`python -m prorl_bench.models.tiny_hf ", 1)[1].split("`", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    return build, code


@pytest.mark.slow
def test_readme_trl_example_runs_as_written(tmp_path):
    model, code = _readme_example()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    built = subprocess.run([sys.executable, "-m", "prorl_bench.models.tiny_hf", model], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=HANG_S)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (tmp_path / "example.py").write_text(code)
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_S)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 resets at RL steps [1, 2, 3, 4]" in proc.stdout


# --------------------------------------------------------------------------- past one process


@pytest.mark.slow
def test_one_trl_run_across_two_cpu_processes(tmp_path, model_dir):
    """accelerate launch --num_processes 2 --cpu: each process trains half of every minibatch (DDP over
    gloo); rank 0 alone writes the run directory, with every process's samples in each row."""
    run = tmp_path / "ddp"
    args = ["-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
            "no", "--dynamo_backend", "no", "--cpu", "-m", "prorl_bench.cli.app", "engine=trl", *_hf(model_dir),
            *QUICK, "steps=2", "variant=C", "reset=periodic", "reset.every=1", f"run_dir={run}",
            f"hydra.run.dir={tmp_path / 'hydra'}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    proc = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_S)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["reset_steps"] == [1, 2]
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # 4 prompts x 4 samples per step, gathered from both processes
        assert round(r["throughput/samples_per_s"] * r["time/step"]) == 16

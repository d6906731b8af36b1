"""Provenance: what a run records about its code, packages, machine and command, and the aggregator's
warning before it compares runs whose provenance differs in anything that changes numbers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from prorl_bench.run import provenance
from prorl_bench.sweeps.aggregate import aggregate
from prorl_bench.sweeps.provenance_check import provenance_warnings
from tests.sweep_factory import metric_rows, write_multirun_yaml, write_run

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A git checkout laid out as the bench's: the package at its top, one commit."""
    root = tmp_path / "bench"
    (root / "prorl_bench").mkdir(parents=True)
    (root / "prorl_bench" / "mod.py").write_text("X = 1\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-qm", "one")
    return root


@needs_git
def test_commit_dirty_state_and_diff_hash_of_a_checkout(checkout):
    pkg = checkout / "prorl_bench"
    clean = provenance.bench_source(pkg)
    assert clean["commit"] == _git(checkout, "rev-parse", "HEAD").strip()
    assert clean["dirty"] is False and clean["diff_sha256"] is None
    (pkg / "mod.py").write_text("X = 2\n")
    dirty = provenance.bench_source(pkg)
    diff = subprocess.run(["git", "-C", str(checkout), "diff", "HEAD", "--binary"], capture_output=True).stdout
    assert dirty["dirty"] is True and dirty["diff_sha256"] == hashlib.sha256(diff).hexdigest()
    (pkg / "new.py").write_text("Y = 1\n")  # an untracked module changes the code too
    more = provenance.bench_source(pkg)
    assert more["dirty"] is True and more["diff_sha256"] not in (None, dirty["diff_sha256"])
    (pkg / "mod.py").write_text("X = 1\n")
    (pkg / "new.py").unlink()
    assert provenance.bench_source(pkg) == clean


@needs_git
def test_no_commit_outside_a_checkout_of_the_bench(tmp_path, checkout):
    """A wheel in site-packages: no commit, never a crash, also inside someone else's repository."""
    loose = tmp_path / "site-packages" / "prorl_bench"
    loose.mkdir(parents=True)
    assert provenance.bench_source(loose)["commit"] is None
    inside = checkout / "venv" / "site-packages" / "prorl_bench"  # a venv inside another checkout
    inside.mkdir(parents=True)
    got = provenance.bench_source(inside)
    assert got["commit"] is None and got["dirty"] is None


def test_no_git_at_all_records_null(monkeypatch, checkout):
    monkeypatch.setenv("PATH", str(checkout))  # no git executable on PATH
    assert provenance.bench_source(checkout / "prorl_bench")["commit"] is None


def test_resolved_config_keeps_loading_as_the_config():
    text = "seed: 3\nalgo:\n  lr: 0.001\n"
    prov = {"packages": {"torch": "2.13.0"}, "command": ["prorl-bench", "seed=3"]}
    written = provenance.config_text(text, prov)
    assert yaml.safe_load(written) == yaml.safe_load(text)  # the comment is invisible to a YAML reader
    assert provenance.config_only(written) == text
    assert provenance.read_yaml_provenance(written) == prov


def test_collect_has_every_field():
    p = provenance.collect(["seed=1"], threads=1)
    assert set(p) == {"bench", "packages", "torch", "machine", "command", "overrides"}
    assert set(p["packages"]) == set(provenance.PACKAGES) and p["packages"]["torch"].startswith("2.")
    assert p["torch"]["num_threads"] == 1 and "PyTorch built with" in p["torch"]["config"]
    assert p["machine"]["cpu_count"] == os.cpu_count() and p["machine"]["gpu"] is None
    assert p["overrides"] == ["seed=1"]
    json.dumps(p)  # JSON-able


def _prov(**changes) -> dict:
    p = {
        "bench": {"version": "0.1.0", "commit": "a" * 40, "dirty": False, "diff_sha256": None},
        "packages": {
            "torch": "2.13.0",
            "numpy": "2.4.6",
            "transformers": None,
            "trl": None,
            "peft": None,
            "hydra-core": "1.3.8",
            "omegaconf": "2.3.1",
        },  # fmt: skip
        "torch": {"num_threads": 1, "blas": "BLAS_INFO=mkl"},
        "machine": {"hostname": "h1", "cpu_model": "Xeon", "gpu": None},
    }
    for path, value in changes.items():
        section, key = path.split("__")
        p[section][key] = value
    return p


def test_warnings_name_what_differs_and_only_that():
    assert provenance_warnings([("a", _prov()), ("b", _prov())]) == []
    assert provenance_warnings([("a", _prov()), ("b", _prov(machine__hostname="h2"))]) == []  # not a number
    w = provenance_warnings([("a", _prov()), ("b", _prov(packages__torch="2.12.0"))])
    assert len(w) == 1 and "torch" in w[0] and "2.13.0 (a)" in w[0] and "2.12.0 (b)" in w[0]
    w = provenance_warnings([("a", _prov()), ("b", _prov(machine__cpu_model="EPYC"))])
    assert len(w) == 1 and "CPU model" in w[0] and "EPYC (b)" in w[0]
    dirty = _prov(bench__dirty=True, bench__diff_sha256="f" * 64)
    w = provenance_warnings([("a", _prov()), ("b", dirty)])
    assert any("diff" in x for x in w) and any("modified tree" in x and "(b)" not in x and "b" in x for x in w)
    w = provenance_warnings([("a", _prov()), ("b", None)])
    assert w == ["1 of 2 runs record no provenance (made before it was recorded, or died before writing "
                 "summary.json): b"]  # fmt: skip


def _two_arm_sweep(d: Path, torch_b: str) -> None:
    d.mkdir()
    write_multirun_yaml(d, {"variant": "A1,B", "seed": "0,1"}, ["steps=4"])
    for variant in ("A1", "B"):
        for seed in (0, 1):
            prov = _prov(packages__torch=torch_b if (variant, seed) == ("B", 1) else "2.13.0")
            write_run(d, [f"variant={variant}", f"seed={seed}", "steps=4"], metrics=metric_rows([0.5] * 4),
                      summary={"status": "completed", "steps_completed": 4, "provenance": prov})  # fmt: skip


def test_aggregator_flags_runs_made_with_another_torch(tmp_path, capsys):
    _two_arm_sweep(tmp_path / "same", "2.13.0")
    res = aggregate(tmp_path / "same", figures=False)
    assert res.provenance_warnings == [] and "WARNING" not in res.markdown
    assert "### Provenance (per group)" in res.markdown and "| A1 | 2/2 |" in res.markdown

    _two_arm_sweep(tmp_path / "other", "2.12.0")
    res = aggregate(tmp_path / "other", figures=False)
    assert len(res.provenance_warnings) == 1 and "B seed=1" in res.provenance_warnings[0]
    warning_at = res.markdown.index("WARNING: runs differ in torch")
    assert warning_at < res.markdown.index("Paired")  # said before any comparison
    assert "2.13.0 / 2.12.0" in res.markdown  # the provenance table shows both in group B


def test_a_run_records_its_provenance(tmp_path, base_cache):
    """The installed entry point, from a directory outside the checkout: summary.json and the resolved
    config carry the provenance, with the command as typed and the job's overrides."""
    exe = str(Path(sys.executable).with_name("prorl-bench"))
    args = ["steps=1", "eval_every=1", f"run_dir={tmp_path / 'run'}", f"warmup.cache_dir={base_cache}",
            "algo.prompts_per_step=2", "algo.group_size=2", "algo.minibatches=1", "eval.n_samples=2",
            "eval.ks=[1,2]", "task.val_size=4", "progress=false"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", provenance.COMMAND_ENV)}
    out = subprocess.run([exe, *args], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    prov = summary["provenance"]
    assert prov["command"] == ["prorl-bench", *args] and prov["overrides"] == args
    assert prov["torch"]["num_threads"] >= 1
    text = (tmp_path / "run" / "config_resolved.yaml").read_text()
    assert provenance.read_yaml_provenance(text) == prov
    assert yaml.safe_load(text)["steps"] == 1
    checkout = Path(provenance.__file__).resolve().parents[2]
    if shutil.which("git") and (checkout / ".git").exists():  # an editable install of a checkout
        head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert prov["bench"]["commit"] == head.stdout.strip()

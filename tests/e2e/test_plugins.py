"""Options from the user's own modules (docs/extending.md): five files outside the package, taken from
the docs as printed, register an advantage estimator, a reset trigger, a task, a moving reference
strategy (an EMA of the policy) and a KL estimator, each with a parameter; ``plugins=[...]`` makes them
valid config values, their parameters flat keys, and they train from the command line. No package
file is edited.

Also: ``kl/base`` of a reference that moves on its own is the KL to the true base (not ``kl/ref``),
and the ``prorl_bench.plugins`` entry-point group loads an installed plugin without ``plugins=``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from prorl_bench import registry
from prorl_bench.config import ConfigError
from prorl_bench.run.outputs import read_jsonl
from tests.conftest import FAST, make_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
FILE_BLOCK = re.compile(r"```python\n# (\w+)\.py: (.*?)\n(.*?)```", re.S)


def doc_files() -> dict[str, str]:
    """module name -> source: the five files of docs/extending.md's walkthrough, as printed there."""
    return {name: f"# {name}.py: {head}\n{body}" for name, head, body in FILE_BLOCK.findall(DOC.read_text())}


MODULES = ["clipped_grpo", "every_after", "reverse_letters", "ema_reference", "scaled_abs_kl"]
NAMES = {
    registry.ADVANTAGES: "clipped_grpo",
    registry.RESET_TRIGGERS: "every_after",
    registry.TASKS: "reverse_letters",
    registry.REFERENCES: "ema",
    registry.KL_ESTIMATORS: "abs_k1",
}
ALL = f"plugins=[{','.join(MODULES)}]"


def _write_plugin(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, source in doc_files().items():
        (directory / f"{name}.py").write_text(source)
    return directory


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The docs' five modules imported in this process (as ``plugins=[...]`` would), unregistered afterwards."""
    monkeypatch.syspath_prepend(str(_write_plugin(tmp_path / "plugin")))
    registry.load_plugins(MODULES)
    yield ALL
    for reg, option in NAMES.items():
        reg.remove(option)
    for name in MODULES:
        sys.modules.pop(name, None)
    importlib.invalidate_caches()


def test_the_docs_show_five_files_one_option_each():
    assert sorted(doc_files()) == sorted(MODULES)


def test_plugin_options_validate_with_their_own_parameters(plugin):
    cfg = make_config(
        [plugin, "variant.name=EMA", "variant.reference=ema", "variant.resets=true", "++variant.rate=0.25",
         "reset.trigger=every_after", "++reset.every=4", "task.name=reverse_letters", "++task.alphabet=xyz",
         "algo.advantage=clipped_grpo", "++algo.clip=0.5", "kl_estimator.name=abs_k1", "++kl_estimator.scale=2"]
    )  # fmt: skip
    assert (cfg.variant.params.rate, cfg.reset.params.every, cfg.reset.params.start) == (0.25, 4, 3)
    assert (cfg.task.params.alphabet, cfg.algo.params.clip, cfg.kl_estimator.params.scale) == ("xyz", 0.5, 2.0)
    bad = {
        "++reset.every=0": "reset.every=0: allowed >= 1",
        "++reset.evry=3": "unknown config key reset.evry; did you mean reset.every? (reset trigger 'every_after' "
        "takes reset.every, reset.start)",
        "++reset.every=x": "invalid config value reset.every='x'",
    }
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            make_config([plugin, "variant=C", "reset.trigger=every_after", override])
    with pytest.raises(ConfigError, match=re.escape("variant.rate=2.0: allowed in")):
        make_config(["variant.name=EMA", "variant.reference=ema", "++variant.rate=2.0"])
    # another option's parameter (every_after's start) has no effect on periodic, as reset.every on reset=none
    assert make_config([plugin, "variant=C", "reset=periodic", "++reset.start=3"]).reset.params.every == 50


def test_step_counter_warning_reads_the_triggers_declared_period(plugin):
    """The warning knows nothing of trigger names: a plugin trigger that declares a short period gets it."""
    from prorl_bench.rl.resets import StepCounterHazardWarning

    hazard = ["variant=C", "reset.trigger=every_after", "opt_reset=soft"]
    with pytest.warns(StepCounterHazardWarning, match="every 5 steps"):
        make_config([*hazard, "++reset.every=5"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", StepCounterHazardWarning)
        make_config([*hazard, "++reset.every=100"])  # rare resets: no hazard


def test_missing_plugin_module_is_a_config_error():
    with pytest.raises(ConfigError, match="plugins='no_such_plugin_module'.*PYTHONPATH"):
        make_config(["plugins=[no_such_plugin_module]"])


def test_moving_reference_logs_the_kl_to_the_true_base(plugin, run_exp):
    """beta = 0: the reference does not touch the update, so an EMA run and an A1 run train the same
    trajectory; A1's reference *is* the base, so its kl/ref is the truth for the EMA run's kl/base."""
    moving = ["algo.beta=0", "algo.entropy_coef=0.05"]  # the entropy bonus moves the policy whatever the reward
    _, a1 = run_exp([*moving, "variant=A1"], "a1")
    ema_over = [*moving, "variant.name=EMA", "variant.reference=ema", "++variant.rate=0.5"]
    _, ema = run_exp([plugin, *ema_over], "ema")
    a1_rows, ema_rows = read_jsonl(a1 / "metrics.jsonl"), read_jsonl(ema / "metrics.jsonl")
    assert [r["reward/mean"] for r in a1_rows] == [r["reward/mean"] for r in ema_rows]  # same trajectory
    measured = [r for r in ema_rows if r["step"] % 3 == 0]  # FAST: eval_every=3 (regular validations)
    assert [r["step"] for r in measured] == [3, 6]
    for e in measured:
        truth = a1_rows[e["step"] - 1]["kl/ref"]
        assert e["kl/base"] == pytest.approx(truth, rel=1e-6, abs=1e-9)
        assert abs(e["kl/ref"] - truth) > 1e-3  # the moved reference is not the base: kl/ref is not kl/base
    assert ema_rows[0]["kl/base"] == ema_rows[0]["kl/ref"]  # step 1: the EMA has not moved yet
    assert all(r["kl/base"] is None for r in ema_rows[1:] if r["step"] % 3)  # moved, not measured (NaN: null)


@pytest.mark.slow
def test_plugin_options_train_from_the_command_line(tmp_path, base_cache):
    """``prorl-bench plugins=[...] ...`` with all five additions at once, in a subprocess, their parameters
    typed without ``+`` (docs/extending.md's command)."""
    plugin_dir = _write_plugin(tmp_path / "plugin")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")]))
    run_dir = tmp_path / "run"
    cmd = [
        str(Path(sys.executable).with_name("prorl-bench")), ALL,
        "task.name=reverse_letters", "task.alphabet=xyz", "task.min_len=2", "task.max_len=3",
        "algo.advantage=clipped_grpo", "algo.clip=0.5", "kl_estimator.name=abs_k1", "kl_estimator.scale=2",
        "variant.name=EMA", "variant.reference=ema", "variant.resets=true", "variant.rate=0.3",
        "reset.trigger=every_after", "reset.every=2", "reset.start=3",
        *FAST, "progress=false", f"warmup.cache_dir={base_cache}", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_completed"] == 6
    assert summary["reset_steps"] == [4, 6]  # the trigger's own parameters: every 2 steps after step 3
    resets = [e for e in read_jsonl(run_dir / "events.jsonl") if e["event"] == "reset"]
    assert [e["reason"] for e in resets] == ["every_after: every 2 after 3"] * 2
    samples = read_jsonl(run_dir / "samples.jsonl")
    assert samples and all(s["prompt"].startswith("L") and set(s["prompt"][1:-1]) <= set("xyz") for s in samples)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    # kl/ref is 2 |l| averaged; kl/ref_k1 averages l itself: |mean l| <= mean |l| <= mean 2|l|
    assert all(r["kl/ref"] >= 2 * abs(r["kl/ref_k1"]) - 1e-7 for r in rows)
    resolved = (run_dir / "config_resolved.yaml").read_text()  # the composed options, their keys only
    for line in ("clip: 0.5", "alphabet: xyz", "scale: 2.0", "rate: 0.3", "every: 2", "start: 3"):
        assert line in resolved


def test_entry_point_plugin_loads_without_the_plugins_key(tmp_path):
    """An installed package that declares ``[project.entry-points."prorl_bench.plugins"]`` registers
    its options at the first registry lookup (a .dist-info on sys.path is what pip installs)."""
    site = _write_plugin(tmp_path / "site")
    dist = site / "user_options_ep-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: user-options-ep\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[prorl_bench.plugins]\nadv = clipped_grpo\nref = ema_reference\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    code = textwrap.dedent("""
        import prorl_bench.config  # declares the built-in options
        from prorl_bench.registry import ADVANTAGES, REFERENCES
        print("clipped_grpo" in ADVANTAGES, "ema" in REFERENCES, "grpo" in ADVANTAGES)
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "True", "True"]

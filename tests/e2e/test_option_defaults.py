"""A declared default is the default: every registered option of every axis — the built-ins and
docs/extending.md's five plugins — selected with no parameter on the line runs with exactly the
defaults its parameter dataclass declares. Checked where a user sees them: what the run records
(``config.complete``: ``--cfg job``, ``config_resolved.yaml``; tests/cli/test_job_config.py holds those
equal) and ``--help`` (one line per key, the same value in the option's own entry). No key of another
option reaches the section. An option is selected by value (``reset.trigger=every_after``) and, when it
has a YAML of its own name in its group (``conf/reset/periodic.yaml``), by group (``reset=periodic``).

Before this held, ``hydra_node`` filled each section with the built-in options' defaults, so the plugin
trigger ``every_after`` (declared ``every: int = 2``) ran with periodic's ``every: 50``, and ``reset=polyak``
(YAML ``every: 25``) differed from ``reset.trigger=polyak`` (50).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import MISSING, OmegaConf

from prorl_bench import registry
from prorl_bench.cli.confhelp import help_text
from prorl_bench.config import Config, complete
from prorl_bench.config.options import common_keys
from prorl_bench.searchpath import CONF_DIR
from tests.conftest import compose_cfg
from tests.e2e.test_plugins import ALL, NAMES, _write_plugin, plugin  # noqa: F401  (the docs' five modules)

EXE = str(Path(sys.executable).with_name("prorl-bench"))


def _example() -> str:
    from prorl_bench.tasks.math_jsonl_task import EXAMPLE

    return str(EXAMPLE)


# a parameter without a default: the one value given
REQUIRED = {("detector.name", "pattern"): {"regex": "7$"}, ("task.name", "math_jsonl"): {"path": _example()}}


def _select(reg: registry.Registry, name: str, hf_dir: Path, by_group: bool) -> list[str]:
    """Overrides that make a valid config selecting ``name`` and nothing else of its axis's parameters."""
    pick = f"{reg.section}={name}" if by_group else f"{reg.key}={name}"
    extra = {
        "reset.trigger": ["variant=C"],
        "variant.reference": ["variant.name=X"] + (["variant.resets=true"] if name != "none" else []),
        "detector.name": ["adapter=dual_lora", "task=hack_compete"],
        "kl_estimator.name": ["kl_estimator.placement=reward"] if name == "k1" else [],
        # a transform that fixes the step policy (hard) needs it stated when selected by value
        "opt_reset.kind": [f"opt_reset.step={s}"] if (s := reg.meta(name).get("step")) and not by_group else [],
        "growth.kind": ["adapter=lora"] if name != "none" else [],  # growth grows a LoRA rank
        # a use of the detector's labels needs a detector; route (the default use) routes between dual adapters
        "route.use": [
            "detector=reward_field",
            "task=hack_compete",
            "adapter=dual_lora" if name == "route" else "adapter=lora",
        ],
    }.get(reg.key, [])
    if reg is registry.ENGINES and name == "trl":  # TRL trains HF models and states its own adv_eps
        extra = ["model=hf_causal_lm", f"model.path={hf_dir}", "algo.adv_eps=1e-4"]
    if reg is registry.TASKS and (registry.TASKS.meta(name).get("needs_hf") or name == "code"):
        extra = ["model=hf_causal_lm", f"model.path={hf_dir}"]
    required = [f"++{reg.section}.{k}={v}" for k, v in REQUIRED.get((reg.key, name), {}).items()]
    return [pick, *extra, *required]


def _declared(reg: registry.Registry, name: str) -> dict[str, Any]:
    """The option's parameters as its dataclass declares them (a required one: the value the test gives)."""
    cls = reg.params_class(name)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls) if cls is not None else ():
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        if default is dataclasses.MISSING or default == MISSING:
            default = REQUIRED[(reg.key, name)][f.name]
        out[f.name] = getattr(default, "value", default)
    return out


def _own_yaml(reg: registry.Registry, name: str) -> bool:
    """``conf/<section>/<name>.yaml`` exists and selects ``name`` (not a preset under another name)."""
    path = CONF_DIR / reg.section / f"{name}.yaml"
    return path.is_file() and (yaml.safe_load(path.read_text()) or {}).get(reg.selector) == name


def _cases() -> list[tuple[str, str, bool]]:
    """(axis key, option, by group) for every registered option and the docs' five plugins."""
    names = [(reg, name) for reg in registry.AXES for name in reg.names()] + list(NAMES.items())
    return [(reg.key, name, by_group) for reg, name in names for by_group in (False, True)[: 1 + _own_yaml(reg, name)]]


CASES = _cases()


def _fmt(value: Any) -> str:
    return "null" if value is None else str(value)


def _help_values(text: str) -> tuple[list[tuple[str, str]], dict[tuple[str, str], list[tuple[str, str]]]]:
    """(every ``key = value`` line of the keys part, in order; the catalogue: (axis key, option) -> its
    parameter lines)."""
    keys_part, catalogue = text.split("== Options of each axis", 1)
    lines = [m.groups() for m in re.finditer(r"^  ([\w.]+) = (.*?)(?:  # .*)?$", keys_part, re.M)]
    options: dict[tuple[str, str], list[tuple[str, str]]] = {}
    axis = option = None
    for line in catalogue.splitlines():
        if m := re.match(r"^(\S+) \(", line):
            axis = m.group(1)
        elif m := re.match(r"^  (\w+)(?:  # .*)?$", line):
            option = m.group(1)
            options[(axis, option)] = []
        elif m := re.match(r"^      ([\w.]+) = (.*?)(?:  # .*)?$", line):
            options[(axis, option)].append(m.groups())
    return lines, options


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """A directory config validation accepts as a Hugging Face model (nothing is loaded from it)."""
    d = tmp_path_factory.mktemp("hf")
    (d / "config.json").write_text("{}")
    return d


@pytest.mark.usefixtures("plugin")
def test_every_option_of_every_axis_is_covered():
    assert {(reg.key, name) for reg in registry.AXES for name in reg.names()} == {(k, n) for k, n, _ in CASES}
    assert {n for _, n, by_group in CASES if by_group} >= {"periodic", "polyak", "kl_spike", "stall", "soft", "k3"}


@pytest.mark.usefixtures("plugin")
@pytest.mark.parametrize("axis,name,by_group", CASES)
def test_selected_option_runs_with_its_declared_defaults(axis, name, by_group, hf_dir):
    reg = next(r for r in registry.AXES if r.key == axis)
    others = {f.name for n in reg.names() if (c := reg.params_class(n)) is not None for f in dataclasses.fields(c)}
    declared = _declared(reg, name)
    composed = compose_cfg([ALL, *_select(reg, name, hf_dir, by_group)])
    recorded = OmegaConf.to_container(complete(composed)[reg.section], resolve=True)
    section_keys = common_keys(type(getattr(Config(), reg.section)))
    params = {k: v for k, v in recorded.items() if k not in section_keys}
    assert params == declared, "what the run records"
    assert not (set(recorded) - section_keys - set(declared)) & others
    lines, options = _help_values(help_text(_root_=composed).replace("$$", "$"))  # as Hydra prints it
    keys = [k for k, _ in lines]
    assert len(keys) == len(set(keys)), f"--help shows a key twice: {sorted(keys)}"
    shown = {k.split(".", 1)[1]: v for k, v in lines if k.split(".")[0] == reg.section and k.count(".") == 1}
    assert {k: shown.get(k) for k in declared} == {k: _fmt(v) for k, v in declared.items()}, "--help's keys"
    assert not (set(shown) - section_keys - set(declared)), "--help shows another option's keys"
    entry = {k.split(".", 1)[1]: v for k, v in options[(reg.key, name)]}
    if REQUIRED.get((reg.key, name)) is None:
        assert entry == {k: _fmt(v) for k, v in declared.items()}, "--help's entry of the option"


@pytest.mark.slow  # two entry-point calls (~10 s each on a loaded 2-core machine)
def test_a_plugin_triggers_declared_default_reaches_the_command_line(tmp_path):
    """docs/extending.md's ``every_after`` declares ``every: int = 2``: ``--cfg job`` and ``--help`` of
    ``prorl-bench plugins=[every_after] variant=C reset.trigger=every_after`` show 2 (it showed the
    built-in periodic's 50, and --help both 50 and 2)."""
    env = dict(os.environ, PYTHONPATH=str(_write_plugin(tmp_path / "plugin")))
    line = [EXE, "plugins=[every_after]", "variant=C", "reset.trigger=every_after"]
    job = subprocess.run([*line, "--cfg", "job"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stderr[-2000:]
    reset = yaml.safe_load(job.stdout)["reset"]
    assert (reset["every"], reset["start"]) == (2, 3)
    helped = subprocess.run([*line, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert helped.returncode == 0, helped.stderr[-2000:]
    lines, options = _help_values(helped.stdout)
    assert [v for k, v in lines if k == "reset.every"] == ["2"]
    assert dict(options[("reset.trigger", "every_after")]) == {"reset.every": "2", "reset.start": "3"}

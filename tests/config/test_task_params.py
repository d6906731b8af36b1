"""A task's own keys are its parameters (architecture v5, item 2): flat keys of ``task`` bound to the
dataclass the task registers, recorded only when that task is selected; the old nested names
(``task.code.*``, ``task.reasoning_gym.*``) still work, with a note naming the new key."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from prorl_bench import registry
from prorl_bench.config import CodeTaskConfig, ReasoningGymConfig, TaskConfig, complete, to_config
from prorl_bench.config.options import MovedKeyWarning, common_keys, moved_name
from tests.conftest import compose_cfg

EXE = str(Path(sys.executable).with_name("prorl-bench"))
COMMON = common_keys(TaskConfig)  # name, min_len, max_len, reward, val_size, val_fraction, chat_template


@pytest.mark.parametrize("task", ["sort_digits", "reverse_digits", "add", "hack_compete"])
def test_a_symbol_task_records_no_other_tasks_keys(task):
    """A sort_digits run recorded 19 keys of other tasks (task.code.*, task.reasoning_gym.*, task.path)."""
    recorded = OmegaConf.to_container(complete(compose_cfg([f"task={task}"])))["task"]
    assert set(recorded) == COMMON


@pytest.mark.parametrize("task,cls", [("reasoning_gym", ReasoningGymConfig), ("code", CodeTaskConfig)])
def test_a_task_with_parameters_records_exactly_its_own(task, cls, tiny_hf_dir):
    """task=reasoning_gym records its dataclass's keys (flat) and nothing of code's, and vice versa."""
    hf = ["model=hf_causal_lm", f"model.path={tiny_hf_dir}"] if task == "code" else []
    recorded = OmegaConf.to_container(complete(compose_cfg([f"task={task}", *hf])))["task"]
    assert set(recorded) == COMMON | {f.name for f in fields(cls)}


def test_the_old_nested_names_map_to_the_flat_ones():
    assert moved_name("task.code.timeout_s") == "task.timeout_s"
    assert moved_name("task.reasoning_gym.generator_args.spell_backward") == "task.generator_args.spell_backward"
    assert moved_name("task.code") is None and moved_name("task.timeout_s") is None


def test_a_config_file_with_the_old_nested_section_is_read_as_the_flat_keys():
    """An experiment file written for the old layout (``task: {reasoning_gym: {max_prompt_chars: 20}}``)
    still sets the key, with a warning naming the new one; another task's nested section is ignored,
    as it always was (recorded configs of earlier versions carry one for every task)."""
    cfg = compose_cfg(["task=reasoning_gym"])
    OmegaConf.set_struct(cfg, False)
    cfg.task.reasoning_gym = {"max_prompt_chars": 20}
    cfg.task.code = {"timeout_s": 3.0}  # not the selected task's: no effect, no error
    with pytest.warns(MovedKeyWarning, match=r"task.reasoning_gym.\* is an old name: read as task.\*"):
        conf = to_config(cfg)
    assert conf.task.params.max_prompt_chars == 20
    assert not hasattr(conf.task.params, "timeout_s")


def test_a_params_instance_or_mapping_binds_and_bad_values_name_the_flat_key():
    assert TaskConfig(name="reasoning_gym", params={"max_prompt_chars": 20}).params.max_prompt_chars == 20
    with pytest.raises(registry.ConfigError, match=r"task.max_prompt_chars=3"):
        TaskConfig(name="reasoning_gym", params={"max_prompt_chars": 3})
    with pytest.raises(registry.ConfigError, match=r"unknown config key task.timeout_s: task 'reasoning_gym' takes"):
        TaskConfig(name="reasoning_gym", params={"timeout_s": 3.0})


@pytest.mark.slow  # one entry-point call (~5-10 s on a loaded 2-core machine)
def test_an_old_command_line_still_runs_with_a_note(tmp_path):
    """``task.reasoning_gym.max_prompt_chars=20`` on the command line (installed entry point, temporary
    directory) is read as ``task.max_prompt_chars=20``; stderr says so; the recorded config has the new key."""
    line = [EXE, "task=reasoning_gym", "task.reasoning_gym.max_prompt_chars=20", "--cfg", "job"]
    job = subprocess.run(line, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stderr[-2000:]
    assert "task.reasoning_gym.max_prompt_chars is an old name, read as task.max_prompt_chars" in job.stderr
    assert "did you mean task.max_prompt_chars=20?" in job.stderr
    task = yaml.safe_load(job.stdout)["task"]
    assert task["max_prompt_chars"] == 20 and "reasoning_gym" not in task and "code" not in task

"""Every config key has help text, and `prorl-bench --help` shows it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from prorl_bench.cli.confhelp import _class_comments, field_help


def test_every_config_key_has_help_text():
    missing = [key for key, (_, text) in field_help().items() if not text]
    assert missing == [], f"config fields without a comment in prorl_bench/config/: {missing}"


def test_comment_extraction_reads_same_line_and_block_above():
    @dataclasses.dataclass
    class Toy:
        a: int = 1  # same line
        # block line one
        # block line two
        b: int = 2
        c: int = 3

    assert _class_comments(Toy) == {"a": "same line", "b": "block line one block line two"}


def test_help_lists_groups_and_keys():
    out = subprocess.run(
        [sys.executable, "-m", "prorl_bench.cli.app", "--help"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "opt_reset: asym, hard, keep, soft" in out
    assert "algo.eps_high = 0.28  # PPO clip" in out and "warmup.seed = 0" in out


# --------------------------------------------------------------------------- TRL / verl names, typos


from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from prorl_bench.cli.confhelp import _groups, check_overrides  # noqa: E402
from prorl_bench.config import aliases  # noqa: E402
from prorl_bench.searchpath import CONF_DIR  # noqa: E402
from tests.e2e.test_plugins import plugin  # noqa: E402, F401  (the docs' five modules)


@pytest.mark.parametrize("plus", ["", "+", "++"], ids=["bare", "plus", "plusplus"])
@pytest.mark.parametrize(
    "typed,want",
    [
        ("algo.learning_rate=1e-5", "algo.lr=1e-5"),
        ("learning_rate=1e-5", "algo.lr=1e-5"),
        ("beta=0.04", "algo.beta=0.04"),
        ("num_generations=8", "algo.group_size=8"),
        ("max_completion_length=64", "algo.max_new_tokens=64"),
        ("actor_rollout_ref.actor.optim.lr=1e-6", "algo.lr=1e-6"),
        ("actor_rollout_ref.rollout.n=8", "algo.group_size=8"),
        ("data.max_response_length=128", "algo.max_new_tokens=128"),
        ("algorithm.kl_ctrl.kl_coef=0.001", "algo.beta=0.001 kl_estimator=k1"),
        ("actor_rollout_ref.actor.kl_loss_coef=0.001", "algo.beta=0.001"),
        ("kl_loss_coef=0.001", "algo.beta=0.001"),  # a verl leaf typed alone
    ],
)
def test_foreign_names_get_did_you_mean_with_the_value(plus, typed, want):
    problems, corrected = check_overrides(["steps=3", plus + typed])
    assert len(problems) == 1 and f"did you mean {want}?" in problems[0], problems
    assert corrected == ["steps=3", *want.split()]


def test_semantic_differences_are_converted_or_noted():
    def fix(*args: str) -> tuple[str, list[str]]:
        problems, corrected = check_overrides(list(args))
        return " ".join(problems), corrected

    # verl's mini-batch is a size in prompts; algo.minibatches a count per epoch: 16 / 4 = 4
    _, c = fix("data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=4")
    assert c == ["algo.prompts_per_step=16", "algo.minibatches=4"]
    # TRL's batch counts completions: 16 completions x 2 accumulation steps / 4 per prompt = 8 prompts
    _, c = fix("num_generations=4", "gradient_accumulation_steps=2", "per_device_train_batch_size=16")
    assert c == ["algo.group_size=4", "algo.prompts_per_step=8", "algo.minibatches=1"]
    # TRL counts optimizer steps between syncs; reset.every RL steps (2 epochs x 2 minibatches each by default)
    _, c = fix("ref_model_sync_steps=512")
    assert c == ["variant=C", "reset=polyak", "reset.every=128"]
    # TRL's epsilon_high defaults to epsilon; the bench's eps_high to 0.28: both are set unless given
    assert fix("epsilon=0.3")[1] == ["algo.eps_low=0.3", "algo.eps_high=0.3"]
    assert fix("epsilon=0.3", "epsilon_high=0.4")[1] == ["algo.eps_low=0.3", "algo.eps_high=0.4"]
    assert fix("actor_rollout_ref.rollout.top_k=-1")[1] == ["algo.top_k=0"]  # verl's "off" is -1, ours 0
    assert fix("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")[1] == ["algo.loss_agg=sequence"]
    text, c = fix("beta=0")
    assert c == ["algo.beta=0"] and "variant=B" in text  # TRL's beta=0 also drops the reference model
    text, _ = fix("beta=0.04")
    assert "TRL's default is 0.0" in text


def test_typos_get_the_closest_keys():
    problems, corrected = check_overrides(["algo.lrr=0.1", "stepz=5", "placement=reward"])
    assert "did you mean algo.lr=0.1?" in problems[0]
    assert "did you mean steps=5?" in problems[1]
    assert "did you mean kl_estimator.placement=reward?" in problems[2]
    assert corrected == ["algo.lr=0.1", "steps=5", "kl_estimator.placement=reward"]


def test_valid_command_lines_pass_untouched(tiny_hf_dir):
    args = [
        "variant=C", "reset=periodic", "reset.every=10", "+sweep=ablation_small", "+arm=A1,B", "+kl_setup=k3_loss",
        "experiment=prorl_v2", "hydra/launcher=joblib", "hydra.run.dir=/tmp/x", "hydra.launcher.n_jobs=2",
        "task.generator_args.spell_backward.min_word_len=3", "detector.regex=7",
        "adapter.targets=[q_proj,v_proj]", "adapter.targets=[qkv]", "~tracking", "seed=0,1,2", "algo.lr=1e-3",
        f"model.path={tiny_hf_dir}", "task.chat_template=x.jinja", "task.path=p.jsonl", "run_dir=/tmp/r", "-m",
    ]  # fmt: skip
    assert check_overrides(args) == ([], args)


def test_the_table_covers_twenty_knobs_of_each_and_every_target_exists():
    assert len(aliases.TRL) >= 20 and len(aliases.VERL) >= 20
    assert len(aliases.TABLE) == len(aliases.TRL) + len(aliases.VERL)  # no name listed twice
    groups = _groups()
    for alias in aliases.TRL + aliases.VERL:
        hint = aliases.translate(alias.name, "2", {})  # a value every numeric knob takes
        assert hint is not None and (hint.overrides or hint.note), alias.name
        for override in hint.overrides:
            key, value = override.split("=", 1)
            assert check_overrides([override])[0] == [], override  # a key of the bench
            if key in groups and "." not in key:  # group=option: the option file exists
                assert (Path(CONF_DIR) / key / f"{value}.yaml").is_file(), override


def test_cli_says_did_you_mean_before_hydra(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "prorl_bench.cli.app", "learning_rate=1e-5", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "did you mean algo.lr=1e-5?" in proc.stderr
    assert "Could not override" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "outputs").exists()


def test_sweep_cli_says_did_you_mean_too(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "prorl_bench.cli.sweep", "+sweep=ablation_small", "num_generations=4", "--dry-run"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "did you mean algo.group_size=4?" in proc.stderr
    assert "prorl-bench-sweep +sweep=ablation_small algo.group_size=4 --dry-run" in proc.stderr


def _a_sentence(text: str, name: str) -> bool:
    """One line that reads as a whole sentence: it starts as one (a capital, or the option's own name,
    ``k1 = ...``), ends with a full stop, and leaves no parenthesis or literal open (a line cut from a
    longer docstring does not)."""
    return (
        bool(text)
        and "\n" not in text
        and len(text) <= 120
        and (text[0].isupper() or text.startswith(name))
        and text.endswith(".")
        and text.count("(") == text.count(")")
        and text.count("``") % 2 == 0
    )


def test_the_sentence_check_can_fail():
    assert _a_sentence("Every ``reset.every`` steps.", "periodic")
    cut = "TRL's ``sync_ref_model``: every ``reset.every`` steps with a default mix of ``reset.alpha``"
    assert not _a_sentence(cut, "polyak")  # polyak's line, cut from its docstring's first line
    assert not _a_sentence("", "reverse_digits")  # a task without one
    assert not _a_sentence("``reset.metric`` has not improved on its best by more than (``min_delta``", "stall")


@pytest.mark.usefixtures("plugin")
def test_every_option_and_task_has_a_one_line_sentence_in_help():
    """``--help`` describes every registered option of every axis — the built-ins (declared with their
    description) and docs/extending.md's five plugins (their docstring's first paragraph) — in one line
    that is a whole sentence."""
    import re

    from prorl_bench import registry
    from prorl_bench.cli.confhelp import options_text

    shown: dict[tuple[str, str], str] = {}
    axis = None
    for line in options_text().splitlines():
        if m := re.match(r"^(\S+) \(", line):
            axis = m.group(1)
        elif m := re.match(r"^  (\w+)(?:  # (.*))?$", line):
            shown[(axis, m.group(1))] = m.group(2) or ""
    options = [(reg.key, name) for reg in registry.AXES for name in reg.names()]
    assert sorted(shown) == sorted(options)
    bad = {f"{key}={name}": shown[(key, name)] for key, name in options if not _a_sentence(shown[(key, name)], name)}
    assert not bad, f"--help lines that are not one whole sentence: {bad}"

"""Tasks: verifiers, held-out split, tokenizer."""

import random

import pytest

from prorl_bench.config import ConfigError, RewardKind, TaskConfig
from prorl_bench.registry import TASKS
from prorl_bench.tasks.base import CharTokenizer, make_task, partial_reward

BUILTIN = [t for t in TASKS.names() if TASKS.meta(t).get("symbols")]  # the digit/bit tasks (symbol_task)


def test_symbol_tasks_state_their_answers_correctly():
    """The ``solve`` each symbol task declares, on hand-computed inputs (a wrong solver fails here,
    whatever its generator does)."""
    cases = {
        "reverse_digits": ("1203", "3021"),
        "copy": ("907", "907"),
        "sort_digits": ("3101", "0113"),
        "parity": ("1101", "1"),
        "add": ("57+68", "125"),
    }
    for name, (x, want) in cases.items():
        assert TASKS.meta(name)["solve"](x) == want, name


@pytest.mark.parametrize("name", BUILTIN)
def test_targets_are_correct_and_splits_are_disjoint(name):
    task = make_task(TaskConfig(name=name, min_len=2, max_len=4))
    train = task.sample_train(random.Random(0), 300)
    val = task.val_set()
    assert not {p.prompt for p in train} & {p.prompt for p in val}
    solve = TASKS.meta(name)["solve"]  # the task's own statement of the answer (registry metadata)
    for p in train[:50]:
        assert p.target == solve(p.prompt[1:-1])
        assert len(p.prompt) + 1 <= task.max_prompt_len
        assert len(p.target) + 1 <= task.max_completion_len


def test_rewards_exact_and_partial():
    assert partial_reward("1234", "1234") == 1.0
    assert partial_reward("1200", "1234") == 0.5
    assert partial_reward("12", "1234") == 0.5
    assert partial_reward("123456", "1234") == 4 / 6
    exact = make_task(TaskConfig(reward=RewardKind.exact))
    part = make_task(TaskConfig(reward=RewardKind.partial))
    assert exact.reward("1200", "1234") == 0.0 and part.reward("1200", "1234") == 0.5


def test_tiny_problem_space_without_validation_split_fails_clearly():
    task = make_task(TaskConfig(name="parity", min_len=1, max_len=1, val_fraction=0.01))
    with pytest.raises(ConfigError, match="no validation problems"):
        task.val_set()


def test_tokenizer_roundtrip_and_left_padding():
    tok = CharTokenizer()
    assert tok.decode(tok.encode("R123=") + [tok.EOS, 5, 6]) == "R123="
    ids, mask = tok.encode_prompts(["R1=", "R123="])
    assert ids.shape == (2, 6) and mask[0].tolist() == [False, False, True, True, True, True]
    assert ids[0, 2] == tok.BOS
    with pytest.raises(ValueError, match="outside"):
        tok.encode("é")


@pytest.mark.parametrize("name", [t for t in TASKS.names() if TASKS.hook(t, "lengths") is not None])
def test_declared_lengths_are_the_built_tasks(name):
    """A task's declared ``lengths`` (config/builtin_options.py: what the config's context check reads
    without building the task) equal the built task's, for the prompt styles the character-level
    policy takes (reasoning_gym's chat prompts add their template: HF models only)."""
    for max_len in (2, 5):
        cfg = TaskConfig(name=name, min_len=1, max_len=max_len)
        task = make_task(cfg)
        assert TASKS.hook(name, "lengths")(cfg) == (task.max_prompt_len, task.max_completion_len), (name, max_len)

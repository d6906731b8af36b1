"""task=reasoning_gym: generators, held-out split, the package's own verifier, end to end."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("reasoning_gym")

from prorl_bench.config import (  # noqa: E402
    AlgoConfig,
    Config,
    ConfigError,
    ModelConfig,
    ModelKind,
    PromptStyle,
    ReasoningGymConfig,
    TaskConfig,
    WarmupConfig,
)
from prorl_bench.run.evaluation import score  # noqa: E402
from prorl_bench.run.trainer import train  # noqa: E402
from prorl_bench.tasks.base import CharTokenizer, make_task  # noqa: E402
from tests.conftest import make_config  # noqa: E402

GENS = ["spell_backward", "basic_arithmetic", "number_sorting"]
ARGS = {
    "spell_backward": {"min_word_len": 3, "max_word_len": 5},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "max_digits": 2, "operators": ["+", "-"]},
    "number_sorting": {"min_numbers": 2, "max_numbers": 3, "max_decimals": 0},
}


def _task_cfg(gens=GENS, **kw) -> TaskConfig:
    rg = ReasoningGymConfig(generators=list(gens), generator_args={g: ARGS[g] for g in gens}, max_answer_chars=24, **kw)
    return TaskConfig(name="reasoning_gym", val_size=32, params=rg)


def test_generators_split_and_verifier():
    task = make_task(_task_cfg())
    val = task.val_set()
    train_set = task.sample_train(random.Random(0), 300)
    assert {p.generator for p in train_set} == set(GENS)
    assert {p.generator for p in val} == set(GENS)
    assert not {p.prompt for p in val} & {p.prompt for p in train_set}  # held out by content too
    tok = CharTokenizer()
    for p in val + train_set:
        assert len(p.prompt) <= 40 and len(p.target) <= 24
        tok.encode(p.prompt), tok.encode(p.target)  # printable ASCII: the char policy can read it
    # the package's own score_answer is the reward: the reference answer scores 1, garbage 0
    rewards, success = score(task, [p.target for p in val], val)
    assert all(r == 1.0 for r in rewards) and all(success)
    rewards, success = score(task, ["zzz"] * len(val), val)
    assert all(r < 1.0 for r in rewards) and not any(success)
    # spell_backward's scorer gives partial credit to a near miss
    sb = next(p for p in val if p.generator == "spell_backward")
    near = sb.target[:-1] + ("a" if sb.target[-1] != "a" else "b")
    assert 0.0 <= task.score(near, sb)[0] < 1.0


def test_scoring_builds_one_scorer_per_generator(monkeypatch):
    """Validation before the first training step scores with datasets built for their score_answer:
    one per generator, not one per completion (spell_backward reads its word list in its constructor)."""
    task = make_task(_task_cfg())
    val = task.val_set()
    built: list[str] = []
    dataset = task._dataset
    monkeypatch.setattr(task, "_dataset", lambda name, seed, size: built.append(name) or dataset(name, seed, size))
    for _ in range(3):
        rewards, _ = score(task, [p.target for p in val], val)
        assert all(r == 1.0 for r in rewards)
    assert sorted(built) == sorted(GENS)


def test_split_is_deterministic_and_depends_on_the_seeds():
    a = make_task(_task_cfg()).sample_train(random.Random(5), 20)
    b = make_task(_task_cfg()).sample_train(random.Random(5), 20)
    assert [p.prompt for p in a] == [p.prompt for p in b]
    v1 = [p.prompt for p in make_task(_task_cfg()).val_set()]
    v2 = [p.prompt for p in make_task(_task_cfg(val_seed=7)).val_set()]
    assert v1 != v2


def test_question_style_uses_the_full_question():
    task = make_task(_task_cfg(["spell_backward"], prompt_style=PromptStyle.question, max_prompt_chars=120))
    p = task.val_set()[0]
    assert p.prompt.startswith("Spell this word backward") and p.entry["metadata"]["word"] in p.prompt


def test_bad_generator_args_fail_clearly():
    with pytest.raises(ConfigError, match="generator_args"):
        ReasoningGymConfig(generators=["spell_backward"], generator_args={"basic_arithmetic": {}})
    task = make_task(
        TaskConfig(
            name="reasoning_gym",
            params=ReasoningGymConfig(
                generators=["spell_backward"], generator_args={"spell_backward": {"no_such_arg": 1}}
            ),
        )
    )
    with pytest.raises(ConfigError, match="spell_backward"):
        task.val_set()


def _run_cfg(model: ModelConfig, gens=("spell_backward", "basic_arithmetic")) -> Config:
    return Config(
        task=_task_cfg(gens),
        model=model,
        algo=AlgoConfig(prompts_per_step=2, group_size=4, minibatches=2),
        warmup=WarmupConfig(enabled=False),
        steps=2,
        eval_every=2,
        progress=False,
    )


def test_end_to_end_native_policy(tmp_path):
    summary = train(_run_cfg(ModelConfig(max_seq_len=72)), tmp_path / "run", tmp_path / "c")
    assert summary["status"] == "completed"
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(0.0 <= r["reward/mean"] <= 1.0 for r in rows)


def test_end_to_end_hf_tokenizer(tiny_hf_dir, tmp_path):
    cfg = _run_cfg(ModelConfig(kind=ModelKind.hf_causal_lm, path=str(tiny_hf_dir)))
    assert train(cfg, tmp_path / "run", tmp_path / "c")["status"] == "completed"


def test_choosing_another_generator_does_not_trip_over_the_default_arguments():
    """The shipped YAML's per-generator defaults must not blame a key the user never set."""
    cfg = make_config(["task=reasoning_gym", "task.generators=[basic_arithmetic]"])
    task = make_task(cfg.task)
    assert len(task.val_set()) == cfg.task.val_size


def test_a_bad_generator_argument_names_the_key_the_user_set():
    cfg = make_config(
        [
            "task=reasoning_gym",
            "task.generators=[basic_arithmetic]",
            "+task.generator_args.basic_arithmetic={min_terms: 9, max_terms: 1}",
        ]
    )
    with pytest.raises(ConfigError, match=r"task.generator_args.basic_arithmetic=.*max_terms"):
        make_task(cfg.task).val_set()


def test_a_misspelled_generator_gets_the_closest_names():
    cfg = TaskConfig(name="reasoning_gym", params=ReasoningGymConfig(generators=["number_sortng"]))
    with pytest.raises(ConfigError, match=r"generators=.number_sortng.: .*did you mean number_sorting or"):
        make_task(cfg)  # before any dataset is built (and before a run directory exists, for the native policy)
    with pytest.raises(ConfigError, match=r"generators='number_sortng'"):
        make_config(["task=reasoning_gym", "task.generators=[number_sortng]"])
    with pytest.raises(ConfigError, match="allowed: .*spell_backward"):  # nothing close: the list
        make_task(TaskConfig(name="reasoning_gym", params=ReasoningGymConfig(generators=["zzzzqq"])))

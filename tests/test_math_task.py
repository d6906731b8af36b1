"""The math task for real models: gsm_symbolic through a chat template, answer extraction, and
the package's verifier on hand-written completions; a tiny HF model runs it end to end."""

from __future__ import annotations

import pytest

from prorl_bench.config import ConfigError

from .conftest import make_config

pytest.importorskip("reasoning_gym")

from prorl_bench.reasoning_gym_task import CHAT_INSTRUCTION, ReasoningGymTask, extract_answer  # noqa: E402


@pytest.mark.parametrize(
    "completion,numeric,expected",
    [
        ("Let me think. 3*4=12. <answer>12</answer>", True, "12"),
        ("<answer>1</answer> wait, no: <answer>7</answer>", True, "7"),  # the last tag counts
        ("so the total is 1,234 apples.\nAnswer: 1,234.", True, "1234"),
        ("The answer is: 42\nmore text", True, "42"),
        ("first 5 then 10 then finally 288", True, "first 5 then 10 then finally 288"),  # no format: as is
        ("olleh", False, "olleh"),  # nothing to extract: the completion itself
        ("no digits here", True, "no digits here"),
    ],
)
def test_extract_answer(completion, numeric, expected):
    assert extract_answer(completion, numeric=numeric) == expected


def test_last_number_fallback_is_opt_in():
    assert extract_answer("first 5 then 10 then finally 288", numeric=True, last_number=True) == "288"
    assert extract_answer("no digits", numeric=True, last_number=True) == "no digits"
    assert extract_answer("no format 12", numeric=True, strict=True) is None


@pytest.fixture(scope="module")
def gsm_task():
    from omegaconf import OmegaConf

    from prorl_bench.config import TaskConfig

    from .conftest import compose_cfg

    raw = compose_cfg(["task=gsm", "task.val_size=4"])  # task config alone: the native policy refuses chat
    task_cfg = OmegaConf.to_object(raw.task)
    assert isinstance(task_cfg, TaskConfig)
    return ReasoningGymTask(task_cfg)


def test_gsm_task_scores_extracted_answers_with_the_package_verifier(gsm_task):
    p = gsm_task.val_set()[0]
    assert p.prompt.endswith(CHAT_INSTRUCTION) and p.generator == "gsm_symbolic"
    right, wrong = p.target, str(int(p.target) + 1)
    assert gsm_task.score(f"Step by step ... <answer>{right}</answer>", p) == (1.0, True)
    assert gsm_task.score(f"I think it is {wrong}. Answer: {right}", p) == (1.0, True)
    assert gsm_task.score(f"<answer>{wrong}</answer>", p)[1] is False
    assert gsm_task.score("", p) == (0.0, False)
    # the package's verifier reads the first number of anything; unformatted text gets no credit
    assert gsm_task.score(f"{right} apples", p) == (0.0, False)
    assert gsm_task.max_completion_len == 256


def test_chat_prompts_need_an_hf_tokenizer_with_a_template(tiny_hf_dir):
    with pytest.raises(ConfigError, match="prompt_style"):
        make_config(["task=gsm"])  # the native char-level policy has no chat template
    from prorl_bench.hf_model import load_tokenizer

    with pytest.raises(ConfigError, match="chat_template"):
        load_tokenizer(tiny_hf_dir, chat=True)


@pytest.fixture(scope="module")
def chat_hf_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from prorl_bench.tiny_hf import build_tiny_llama

    return build_tiny_llama(
        tmp_path_factory.mktemp("hf") / "chat",
        hidden_size=32,
        n_layers=2,
        n_heads=4,
        chat_template=True,
        max_position_embeddings=1024,
    )


def test_chat_template_renders_the_prompt(chat_hf_dir):
    from prorl_bench.hf_model import load_tokenizer

    tok = load_tokenizer(chat_hf_dir, chat=True)
    ids, mask = tok.encode_prompts(["What is 2+2?", "Hi"])
    row = ids[0][mask[0]].tolist()
    rendered = tok.hf.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered == "[BOS]<user> What is 2+2? <assistant> "
    assert row == tok.hf.encode(rendered, add_special_tokens=False) and row[0] == tok.BOS
    assert mask[1].sum() < mask[0].sum()  # left-padded


def test_gsm_runs_end_to_end_on_a_tiny_hf_model(chat_hf_dir, tmp_path):
    from prorl_bench.outputs import read_jsonl
    from prorl_bench.trainer import train

    cfg = make_config(
        [
            "task=gsm",
            "model=hf_causal_lm",
            f"model.path={chat_hf_dir}",
            "task.reasoning_gym.max_completion_tokens=24",
            "task.val_size=4",
            "steps=2",
            "eval_every=2",
            "algo.prompts_per_step=2",
            "algo.group_size=2",
            "progress=false",
        ]
    )
    summary = train(cfg, tmp_path / "run", tmp_path / "cache")
    assert summary["status"] == "completed" and summary["steps_completed"] == 2
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in rows)  # a random model: ~0, but scored
    assert all(r["response_len"] <= 24 for r in rows)

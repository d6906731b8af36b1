"""The math task for real models: gsm_symbolic through a chat template, answer extraction, and
the package's verifier on hand-written completions; a tiny HF model runs it end to end."""

from __future__ import annotations

import pytest

from prorl_bench.config import ConfigError
from tests.conftest import make_config

pytest.importorskip("reasoning_gym")

from prorl_bench.tasks.reasoning_gym_task import CHAT_INSTRUCTION, ReasoningGymTask, extract_answer  # noqa: E402


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
    from prorl_bench.config.root import split_options
    from tests.conftest import compose_cfg

    # the task section alone (the native policy refuses a chat task), typed through its schema: Hydra's
    # base config is untyped since options bind their own parameters (split_options: flat keys -> params)
    raw = split_options(compose_cfg(["task=gsm", "task.val_size=4"]))
    task_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TaskConfig), raw.task))
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
    from prorl_bench.models.hf_model import load_tokenizer

    with pytest.raises(ConfigError, match="chat_template"):
        load_tokenizer(tiny_hf_dir, chat=True)


@pytest.fixture(scope="module")
def chat_hf_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from prorl_bench.models.tiny_hf import build_tiny_llama

    return build_tiny_llama(
        tmp_path_factory.mktemp("hf") / "chat",
        hidden_size=32,
        n_layers=2,
        n_heads=4,
        chat_template=True,
        max_position_embeddings=1024,
    )


def test_chat_template_renders_the_prompt(chat_hf_dir):
    from prorl_bench.models.hf_model import load_tokenizer

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
    from prorl_bench.run.outputs import read_jsonl
    from prorl_bench.run.trainer import train

    cfg = make_config(
        [
            "task=gsm",
            "model=hf_causal_lm",
            f"model.path={chat_hf_dir}",
            "task.max_completion_tokens=24",
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


# --------------------------------------------------------------------------- task=math_jsonl: your own problems


def _jsonl(path, rows):
    import json

    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _math_cfg(path, **kw):
    from prorl_bench.config import MathJsonlConfig, TaskConfig

    files = MathJsonlConfig(path=str(path), val_path=kw.pop("val_path", None))
    return TaskConfig(name="math_jsonl", params=files, **kw)


@pytest.mark.parametrize(
    "bad,message",
    [
        ("{not json", r":3: not valid JSON"),
        ('["question", "answer"]', r":3: expected an object"),
        ('{"question": "q3"}', r":3: field 'answer' missing"),
        ('{"question": "", "answer": "1"}', r":3: field 'question' missing or not a non-empty string"),
        ('{"question": "q3", "answer": true}', r":3: field 'answer'"),
        ('{"question": "q3", "answer": "1", "solution": "x"}', r":3: unknown field\(s\) \['solution'\]"),
        ('{"question": "q1", "answer": "9"}', r":3: the same question as line 1"),
    ],
)
def test_math_jsonl_errors_name_the_file_and_line(tmp_path, bad, message):
    from prorl_bench.tasks.math_jsonl_task import load_problems

    path = _jsonl(tmp_path / "p.jsonl", [{"question": "q1", "answer": "1"}, "", bad])  # line 2 blank: skipped
    with pytest.raises(ConfigError, match="p.jsonl" + message):
        load_problems(path)


def test_math_jsonl_is_checked_when_the_config_is(tmp_path):
    bad = _jsonl(tmp_path / "bad.jsonl", [{"question": "q1", "answer": "1"}, {"question": "q2"}])
    with pytest.raises(ConfigError, match="bad.jsonl:2: field 'answer'"):
        _math_cfg(bad)  # TaskConfig's own validation: before any model or run directory exists
    with pytest.raises(ConfigError, match="task.path=None"):
        from prorl_bench.config import TaskConfig

        TaskConfig(name="math_jsonl")
    from prorl_bench.config.root import UnusedOptionKeyWarning

    with pytest.warns(UnusedOptionKeyWarning, match=r"task.path=.* has no effect: task.name=sort_digits"):
        cfg = make_config([f"task.path={bad}"])  # another task's key: said, not read (as reset.every with reset=none)
    assert cfg.task.params is None
    with pytest.raises(ConfigError, match="model=hf_causal_lm"):
        from prorl_bench.tasks.math_jsonl_task import EXAMPLE

        make_config(["task=math_jsonl", f"task.path={EXAMPLE}"])  # the char-level policy has no chat template


def test_math_jsonl_split_is_disjoint_deterministic_and_order_free(tmp_path):
    from prorl_bench.tasks.math_jsonl_task import split

    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(200)]
    a = split(_math_cfg(_jsonl(tmp_path / "a.jsonl", rows), val_fraction=0.25))
    b = split(_math_cfg(_jsonl(tmp_path / "b.jsonl", rows[::-1]), val_fraction=0.25))
    (train, val), (_, val2) = a, b
    assert {p.question for p in train} & {p.question for p in val} == set()
    assert len(train) + len(val) == 200 and 30 <= len(val) <= 70  # ~25% held out by hash
    assert {p.question for p in val} == {p.question for p in val2}  # the file's order does not matter
    val_file = _jsonl(tmp_path / "v.jsonl", [{"question": "new one", "answer": "3"}])
    train, val = split(_math_cfg(tmp_path / "a.jsonl", val_path=str(val_file)))
    assert len(train) == 200 and [p.question for p in val] == ["new one"]
    clash = _jsonl(tmp_path / "c.jsonl", [rows[0]])
    with pytest.raises(ConfigError, match="task.val_path=.*questions also in task.path"):
        split(_math_cfg(tmp_path / "a.jsonl", val_path=str(clash)))


@pytest.mark.parametrize(
    "completion,target,score",
    [
        ("<answer>7</answer>", "7", 1.0),
        ("I think 3. Then 4. So <answer> 7 </answer>", "7", 1.0),
        ("Answer: 7.", "7", 1.0),
        ("7", "7", 0.0),  # no tag, no "Answer:" line: no answer given (task=gsm's strict extraction)
        ("the total is 7 apples", "7", 0.0),
        ("<answer>8</answer>", "7", 0.0),
        ("<answer>1,234</answer>", "1234", 1.0),  # numbers compare as numbers
        ("<answer>1234.0</answer>", "1,234", 1.0),
        ("<answer>-3</answer>", "3", 0.0),
        ("<answer>Paris </answer>", "Paris", 1.0),  # text: equal up to whitespace
        ("<answer>paris</answer>", "Paris", 0.0),
    ],
)
def test_math_jsonl_scores_like_gsm(tmp_path, completion, target, score):
    from prorl_bench.tasks.math_jsonl_task import MathJsonlTask

    rows = [{"question": f"q{i}", "answer": target} for i in range(40)]
    task = MathJsonlTask(_math_cfg(_jsonl(tmp_path / "p.jsonl", rows), val_fraction=0.5))
    problem = task.val_set()[0]
    assert problem.prompt.endswith(CHAT_INSTRUCTION)
    assert task.score(completion, problem) == (score, score == 1.0)


def test_math_jsonl_example_ships_with_the_package():
    from pathlib import Path

    from prorl_bench.tasks import math_jsonl_task
    from prorl_bench.tasks.math_jsonl_task import EXAMPLE, main, split

    assert EXAMPLE.is_relative_to(Path(math_jsonl_task.__file__).parents[1] / "data")  # package data (pyproject)
    train, val = split(_math_cfg(EXAMPLE, val_fraction=0.25))
    assert len(train) + len(val) == 32 and val
    assert main([str(EXAMPLE)]) == 0


# --------------------------------------------------------------------------- task.chat_template


def test_chat_template_from_text_or_file_replaces_the_tokenizers(tiny_hf_dir, tmp_path):
    from prorl_bench.models.hf_model import load_tokenizer

    template = "{{ bos_token }}Q: {{ messages[0]['content'] }} A:"
    for given in (template, str(_write(tmp_path / "t.jinja", template))):
        tok = load_tokenizer(tiny_hf_dir, chat=True, chat_template=given)  # tiny_hf_dir has no template
        ids, mask = tok.encode_prompts(["2+2?"])
        assert tok.hf.decode(ids[0][mask[0]].tolist()) == "[BOS] Q: 2+2? A:"
        assert ids[0][mask[0]].tolist() == [tok.BOS] + tok.encode("Q: 2+2? A:")


def _write(path, text):
    path.write_text(text)
    return path


def test_bad_chat_template_values_name_the_key(tmp_path, tiny_hf_dir):
    hf = ["model=hf_causal_lm", f"model.path={tiny_hf_dir}"]
    with pytest.raises(ConfigError, match="task.chat_template=.*an existing file"):
        make_config([*hf, "task=code", f"task.chat_template={tmp_path / 'missing.jinja'}"])
    with pytest.raises(ConfigError, match="holds no Jinja template"):
        make_config([*hf, "task=code", f"task.chat_template={_write(tmp_path / 'plain.txt', 'hello')}"])
    with pytest.raises(ConfigError, match="task.chat_template=.*native"):
        make_config(["task.chat_template='{{ messages[0].content }}'"])  # Hydra's quoting of a template


def test_a_missing_template_is_blamed_on_the_setting_that_asked_for_it(tiny_hf_dir):
    from prorl_bench.run.policies import build_tokenizer

    hf = ["model=hf_causal_lm", f"model.path={tiny_hf_dir}"]
    with pytest.raises(ConfigError, match=r"^task\.prompt_style=chat: .*task\.prompt_style=question"):
        build_tokenizer(make_config([*hf, "task=code"]))
    with pytest.raises(ConfigError, match=r"^task\.prompt_style=chat"):
        build_tokenizer(make_config([*hf, "task=gsm"]))
    assert build_tokenizer(make_config([*hf, "task=code", "task.prompt_style=question"])).chat is False


@pytest.mark.slow
def test_math_jsonl_runs_end_to_end_on_a_tiny_hf_model(chat_hf_dir, tmp_path):
    from prorl_bench.run.outputs import read_jsonl
    from prorl_bench.run.trainer import train
    from prorl_bench.tasks.math_jsonl_task import EXAMPLE

    cfg = make_config(["task=math_jsonl", f"task.path={EXAMPLE}", "model=hf_causal_lm", f"model.path={chat_hf_dir}",
                       "algo.max_new_tokens=16", "task.val_size=4", "steps=2", "eval_every=2", "eval.n_samples=2",
                       "eval.ks=[1,2]", "algo.prompts_per_step=2", "algo.group_size=2", "progress=false"])  # fmt: skip
    summary = train(cfg, tmp_path / "run", tmp_path / "cache")
    assert summary["status"] == "completed" and summary["steps_completed"] == 2
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert all(r["response_len"] <= 16 for r in rows)
    samples = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert samples and all(s["prompt"].endswith(CHAT_INSTRUCTION) for s in samples)

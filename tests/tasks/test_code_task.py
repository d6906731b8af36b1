"""task=code: extraction, exact rewards and failure classes on fixed completions (correct, partial,
broken, hostile), the problem files, and an end-to-end RL run on a tiny HF model."""

from __future__ import annotations

import json
import os

import pytest

from prorl_bench.config import CodeTaskConfig, ConfigError, RewardKind, TaskConfig
from prorl_bench.tasks.code_task import DATA_DIR, CodeTask, extract_program, load_problems
from prorl_bench.tasks.sandbox import FAIL_CLASSES, Isolation, isolation, isolation_level
from tests.conftest import make_config

WEAK = isolation_level() != "full" or bool(isolation().missing)  # e.g. no root: these tests check scoring


def _task(reward: RewardKind = RewardKind.partial, **code) -> CodeTask:
    code = {"timeout_s": 3.0, "workers": 4, "allow_weak_isolation": WEAK, **code}
    return CodeTask(TaskConfig(name="code", reward=reward, val_size=12, params=CodeTaskConfig(**code)))


@pytest.fixture(scope="module")
def task() -> CodeTask:
    return _task()


def _problem(task: CodeTask, pid: str):
    return next(p for p in task._train + task._val_all if p.id == pid)


def fenced(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```\nDone."


SECRET_FILE = "/tmp/prorl_bench_code_task_canary"

CASES = [  # (completion for gcd: tests (12,18) (7,13) (100,75) (9,9)), reward, class
    (fenced("def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a"), 1.0, "ok"),
    (fenced("def gcd(a, b):\n    return 1 if a != b else a"), 0.5, "wrong_answer"),  # (7,13) and (9,9) pass
    (fenced("def gcd(a, b):\n    return a // (b - 9)"), 0.25, "exception"),  # 9,9 divides by zero
    (fenced("def gcd(a, b) return a"), 0.0, "syntax_error"),
    ("", 0.0, "no_code"),
    (fenced("def gcd(a, b):\n    while True:\n        pass"), 0.0, "timeout"),
    (fenced("def gcd(a, b):\n    x = bytearray(2**30)\n    return 0"), 0.0, "memory"),  # over the sample's 512 MiB
    (fenced("def gcd(a, b):\n    raise MemoryError"), 0.0, "exception"),  # raised, no limit hit: the program's words
    (fenced("import ctypes\nctypes.string_at(0)"), 0.0, "crashed"),  # a segfault: the kernel's signal
    (fenced("import sys\nsys.exit(0)"), 0.0, "exception"),  # exits before the tests run
    # forging the harness's output without the nonce: every line is ignored
    (fenced("print('0 0 {\"value\": 6}')\ndef gcd(a, b):\n    return -1"), 0.0, "wrong_answer"),
    # writes outside its directory and tries the network; the answer itself is right
    (
        fenced(
            "def gcd(a, b):\n"
            "    try:\n        open('" + SECRET_FILE + "', 'w').write('x')\n    except OSError:\n        pass\n"
            "    try:\n        import socket; socket.create_connection(('1.1.1.1', 53), timeout=1)\n"
            "    except OSError:\n        pass\n"
            "    while b:\n        a, b = b, a % b\n    return a"
        ),
        1.0,
        "ok",
    ),  # fmt: skip
]


def test_fixed_completions_get_exact_rewards_and_classes(task):
    gcd = _problem(task, "gcd")
    if os.path.exists(SECRET_FILE):
        os.remove(SECRET_FILE)
    rewards, success, infos = task.score_many([c for c, _, _ in CASES], [gcd] * len(CASES))
    got = [(r, i["fail"]) for r, i in zip(rewards, infos)]
    assert got == [(r, c) for _, r, c in CASES]
    assert success == [c == "ok" for _, _, c in CASES]
    assert {i["fail"] for i in infos} <= set(FAIL_CLASSES)


def test_exact_reward_is_all_or_nothing():
    t = _task(RewardKind.exact, workers=2)
    gcd = _problem(t, "gcd")
    rewards, _, _ = t.score_many([CASES[0][0], CASES[1][0]], [gcd, gcd])
    assert rewards == [1.0, 0.0]


def test_step_metrics_count_every_class(task):
    gcd = _problem(task, "gcd")
    _, _, infos = task.score_many([CASES[0][0], CASES[1][0], "", CASES[3][0]], [gcd] * 4)
    m = task.step_metrics(infos)
    assert set(m) == {f"code/fail/{c}" for c in FAIL_CLASSES} | {"code/tests_passed"}
    assert m["code/fail/ok"] == m["code/fail/wrong_answer"] == m["code/fail/no_code"] == 0.25
    assert m["code/tests_passed"] == pytest.approx((1 + 0.5 + 0 + 0) / 4)


@pytest.mark.parametrize(
    "text,program",
    [
        ("```python\na = 1\n```\nthen\n```python\nb = 2\n```", "b = 2\n"),  # the last block
        ("```\nc = 3\n```", "c = 3\n"),
        ("<code>d = 4</code>", "d = 4"),
        ("def f():\n    return 5", "def f():\n    return 5"),  # raw
        ("   ", None),
    ],
)
def test_extraction(text, program):
    assert extract_program(text) == program


def test_every_shipped_problem_is_solved_by_its_reference_solution(task):
    problems = task._train + task._val_all
    assert len(task._train) >= 30 and len(task._val_all) >= 12
    assert not {p.id for p in task._train} & {p.id for p in task._val_all}
    rewards, _, infos = task.score_many([fenced(p.solution) for p in problems], problems)
    bad = [(p.id, i) for p, r, i in zip(problems, rewards, infos) if r != 1.0]
    assert bad == []


def test_problem_file_errors_name_file_and_line(tmp_path):
    good = (DATA_DIR / "train.jsonl").read_text().splitlines()[0]
    path = tmp_path / "p.jsonl"
    path.write_text(good + "\n{not json\n")
    with pytest.raises(ConfigError, match=rf"{path}:2: not valid JSON"):
        load_problems(path)
    row = json.loads(good)
    del row["tests"]
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=rf"{path}:1: field 'tests' missing"):
        load_problems(path)
    path.write_text(good + "\n" + good + "\n")
    with pytest.raises(ConfigError, match="duplicate problem ids"):
        load_problems(path)


def test_own_problem_files_and_config_errors(tmp_path):
    train = tmp_path / "mine.jsonl"
    row = {"id": "neg", "prompt": "Return -x.", "entry_point": "neg", "tests": [{"args": [2], "expected": -2}]}
    train.write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match="ids also in training"):
        _task(path=str(train), val_path=str(train))
    with pytest.raises(ConfigError, match="task.path"):
        CodeTaskConfig(path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="task=code needs model=hf_causal_lm"):
        make_config(["task=code", "model=tiny"])


@pytest.mark.slow
def test_end_to_end_rl_on_a_tiny_hf_model(tmp_path):
    pytest.importorskip("transformers")
    from prorl_bench.models.tiny_hf import build_tiny_llama
    from prorl_bench.run.trainer import train

    model = build_tiny_llama(tmp_path / "m", hidden_size=32, n_layers=2, n_heads=4, max_position_embeddings=512)
    cfg = make_config(
        [
            "task=code", "model=hf_causal_lm", f"model.path={model}", "task.prompt_style=question",
            "task.max_completion_tokens=32", "task.val_size=4", "task.workers=4",
            "algo.prompts_per_step=2", "algo.group_size=4", "steps=2", "eval_every=2",
            "eval.n_samples=2", "eval.ks=[1,2]", "eval.n_sample_prompts=2",
        ]
    )  # fmt: skip
    summary = train(cfg, tmp_path / "run", tmp_path / "cache")
    assert summary["status"] == "completed" and summary["steps_completed"] == 2
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for r in rows:  # every sample is counted in exactly one class
        assert sum(r[f"code/fail/{c}"] for c in FAIL_CLASSES) == pytest.approx(1.0)
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "start" and events[0]["sandbox"] == isolation_level()
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert all(s["fail"] in FAIL_CLASSES for row in samples for s in row["samples"])


def test_weak_isolation_is_refused_unless_accepted(monkeypatch, capsys):
    """Below 'full' the task refuses to train, naming the flag and what a program could reach; with the flag
    it runs and says so."""
    import prorl_bench.tasks.code_task as code_task

    weak = Isolation("netns+pidns", "full: needs root (mount namespaces and a private root)")
    monkeypatch.setattr(code_task, "isolation", lambda: weak)
    with pytest.raises(ConfigError, match=r"task.allow_weak_isolation.*'netns\+pidns'.*needs root.*problem files"):
        _task(allow_weak_isolation=False)
    t = _task(allow_weak_isolation=True)
    assert t.isolation == weak
    err = capsys.readouterr().err
    assert "WARNING" in err and "problem files with the expected answers" in err
    monkeypatch.setattr(code_task, "isolation", lambda: Isolation("full"))
    _task(allow_weak_isolation=False)  # full: no flag needed
    assert "isolation: full" in capsys.readouterr().err


@pytest.mark.parametrize(
    "missing,exposed",
    [
        ("cgroup: cgroup v1: no pids hierarchy", "shared memory and memfd unbounded"),
        ("seccomp: libseccomp.so.2: cannot open shared object file", "new user namespaces"),
    ],
)
def test_a_missing_layer_is_named_and_refused_unless_accepted(monkeypatch, capsys, missing, exposed):
    """Namespaces alone are not 'full': without the cgroup or the seccomp layer the task names the layer, why
    it is missing and what a program could then do, and refuses unless the flag accepts it."""
    import prorl_bench.tasks.code_task as code_task

    monkeypatch.setattr(code_task, "isolation", lambda: Isolation("full", "", (missing,)))
    with pytest.raises(ConfigError, match="allow_weak_isolation") as e:
        _task(allow_weak_isolation=False)
    assert missing in str(e.value) and exposed in str(e.value)
    _task(allow_weak_isolation=True)
    err = capsys.readouterr().err
    assert "WARNING" in err and missing in err


def test_code_keys_belong_to_task_code_only():
    """task=code's keys are its parameters: another task has none of them, and code's are bound."""
    assert TaskConfig().params is None and not hasattr(TaskConfig(), "code")
    assert TaskConfig(name="code").params == CodeTaskConfig()


def test_layers_report_what_the_machine_lacks(monkeypatch):
    """The probe itself: with no cgroup hierarchy and no libseccomp, both layers are reported missing with
    the reason, and the task built on that probe refuses (the refusal is tested above)."""
    import prorl_bench.tasks.sandbox.cgroup as sandbox_cgroup
    import prorl_bench.tasks.sandbox.host as sandbox

    monkeypatch.setattr(sandbox_cgroup, "_mounts", lambda: [])
    assert sandbox_cgroup.find_layout() == (None, "no cgroup2 mount; cgroup v1: no memory hierarchy")

    def no_libseccomp():
        raise OSError("libseccomp.so.2: cannot open shared object file")

    monkeypatch.setattr(sandbox, "find_layout", sandbox_cgroup.find_layout)
    monkeypatch.setattr(sandbox, "export_seccomp_bpf", no_libseccomp)
    sandbox._layers.cache_clear()
    try:
        lay = sandbox._layers()
    finally:
        sandbox._layers.cache_clear()
    assert lay.cgroup is None and lay.seccomp == b""
    missing = " | ".join(lay.missing)
    assert "cgroup: " in missing and "seccomp: libseccomp.so.2" in missing and "apt-get install libseccomp2" in missing

"""Property-based tests (Hypothesis): every config value and task input either works or is
rejected with a clear error — never a traceback from deep inside torch, never a hang.

Every test runs without Hypothesis's wall-clock limits (``LOADED``): its default 200 ms deadline per
example failed ``test_verifiers_accept_any_completion`` on a busy 2-core machine (issue 25), a timing
failure that says nothing about the code."""

import math

import pytest
from hydra.errors import ConfigCompositionException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf.errors import OmegaConfBaseException

from prorl_bench.config import ConfigError, TaskConfig, to_config
from prorl_bench.registry import TASKS
from prorl_bench.run.base import WarmupFailed
from prorl_bench.tasks.base import CharTokenizer, make_task, partial_reward
from tests.conftest import compose_cfg

KEYS = [
    "steps",
    "seed",
    "eval_every",
    "task.min_len",
    "task.max_len",
    "task.val_fraction",
    "task.val_size",
    "model.d_model",
    "model.n_layers",
    "model.n_heads",
    "model.dropout",
    "model.max_seq_len",
    "algo.prompts_per_step",
    "algo.group_size",
    "algo.temperature",
    "algo.top_k",
    "algo.eps_low",
    "algo.eps_high",
    "algo.ppo_epochs",
    "algo.minibatches",
    "algo.beta",
    "algo.lr",
    "algo.grad_clip",
    "algo.entropy_coef",
    "algo.adam_beta1",
    "algo.loss_agg",
    "algo.advantage",
    "kl_estimator.kl_clamp",
    "kl_estimator.placement",
    "variant.name",
    "reset.every",
    "opt_reset.factor",
    "checkpoint.keep_last",
    "hardware.torch_threads",
]
VALUES = st.one_of(
    st.integers(-3, 12),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from(["A0", "B", "C", "token", "seq", "grpo", "reward", "", "null", "[1,2]", "abc"]),
)
CLEAN = (ConfigError, ConfigCompositionException, OmegaConfBaseException, WarmupFailed)
SMALL = [
    "steps=2",
    "eval_every=1",
    "warmup.max_steps=20",
    "warmup.check_every=10",
    "warmup.target_success=0.01",
    "task.val_size=8",
    "algo.prompts_per_step=2",
    "algo.group_size=2",
    "algo.minibatches=1",
]


# no per-example deadline, no "data generation too slow" health check: both measure the machine's load
LOADED = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fmt(v):
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    return str(v)


@pytest.mark.slow  # 40 real configs, most of them trained: ~93 s measured under load
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(st.dictionaries(st.sampled_from(KEYS), VALUES, min_size=1, max_size=3))
def test_any_config_runs_or_fails_cleanly(tmp_path_factory, base_cache, overrides):
    from prorl_bench.run.trainer import train

    ovr = SMALL + [f"{k}={_fmt(v)}" for k, v in overrides.items()]
    try:
        cfg = to_config(compose_cfg(ovr))
    except CLEAN as e:
        assert str(e)  # a message, not an empty error
        return
    # valid configs stay small enough to run in a second (bounded by the strategy's ranges)
    d = tmp_path_factory.mktemp("hostile")
    try:
        summary = train(cfg, d / "run", base_cache)  # bases are keyed by their config: shared ones are reused
    except CLEAN:
        return
    assert summary["status"] == "completed"


def _task_and_problem(name):
    from prorl_bench.tasks.math_jsonl_task import EXAMPLE

    own = {"params": {"path": str(EXAMPLE)}} if name == "math_jsonl" else {}  # task=math_jsonl: a file
    task = make_task(TaskConfig(name=name, min_len=2, max_len=4, **own))
    return task, task.val_set()[0]


PROBLEMS = {name: _task_and_problem(name) for name in TASKS.names()}  # reasoning_gym included (dev extra)


@settings(**LOADED)
@given(
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30), st.sampled_from(TASKS.names())
)
def test_verifiers_accept_any_completion(completion, name):
    task, problem = PROBLEMS[name]
    reward, success = task.score(completion, problem)
    bonus = getattr(task, "hack_bonus", 0.0)  # hack tasks pay a bonus on top of (or instead of) the task
    assert 0.0 <= reward <= 1.0 + bonus
    assert success == (reward >= 1.0) if bonus == 0 else (not success or reward >= 1.0)
    assert 0.0 <= partial_reward(completion, problem.target) <= 1.0


@settings(**LOADED)
@given(st.text(max_size=30))
def test_tokenizer_roundtrips_printable_text_and_rejects_the_rest(text):
    tok = CharTokenizer()
    if all(32 <= ord(c) <= 126 for c in text):
        assert tok.decode(tok.encode(text)) == text
    else:
        with pytest.raises(ValueError, match="outside"):
            tok.encode(text)


def test_no_property_test_has_a_wall_clock_limit():
    """Every Hypothesis test of this module runs without a deadline and without the too-slow check."""
    tests = [f for name, f in globals().items() if name.startswith("test_") and hasattr(f, "hypothesis")]
    assert len(tests) == 3
    for f in tests:
        used = f._hypothesis_internal_use_settings
        assert used.deadline is None, f.__name__
        assert HealthCheck.too_slow in used.suppress_health_check, f.__name__

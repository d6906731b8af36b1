"""Adding an option touches one file: a toy advantage estimator and a toy task are registered from
this test module (no package file edited) and trained for a few steps each."""

from __future__ import annotations

import json
import random

import pytest
import torch

from prorl_bench.config import ConfigError
from prorl_bench.registry import ADVANTAGES, TASKS, Registry
from prorl_bench.rl.advantages import compute_advantages
from prorl_bench.tasks.base import symbol_task
from tests.conftest import make_config

CALLS = {"toy_signed": 0}


def toy_signed(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """+1 above the group mean, -1 below, 0 at it (a sign-only baseline)."""
    CALLS["toy_signed"] += 1
    return torch.sign(rewards - rewards.mean(dim=1, keepdim=True))


def _toy_double(rng: random.Random, n: int) -> tuple[str, str]:
    """ "D<digits>=" -> every digit twice (a copy variant the char policy can learn)."""
    x = "".join(rng.choice("0123") for _ in range(n))
    return x, "".join(c + c for c in x)


@pytest.fixture
def toy_options():
    ADVANTAGES.register("toy_signed")(toy_signed)
    symbol_task("toy_double", "D", lambda n: n + 2, lambda n: 2 * n, solve=lambda x: "".join(c + c for c in x))(
        _toy_double
    )
    yield
    ADVANTAGES.remove("toy_signed")
    TASKS.remove("toy_double")


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_toy_advantage_estimator_trains(toy_options, run_exp):
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]])
    expected = torch.tensor([[1.0, -1.0, -1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.equal(compute_advantages("toy_signed", rewards), expected)
    CALLS["toy_signed"] = 0
    summary, run_dir = run_exp(["algo.advantage=toy_signed", "steps=3", "eval_every=3"], "adv")
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    assert CALLS["toy_signed"] == 3  # one advantage computation per step: the toy really ran
    assert len(_rows(run_dir)) == 3


def test_toy_task_trains(toy_options, run_exp):
    cfg = make_config(["task.name=toy_double", "task.min_len=2", "task.max_len=3"])
    from prorl_bench.tasks.base import make_task

    task = make_task(cfg.task)
    problem = task.sample_train(random.Random(0), 1)[0]
    assert problem.prompt.startswith("D") and problem.target == "".join(c + c for c in problem.prompt[1:-1])
    summary, run_dir = run_exp(["task.name=toy_double", "task.min_len=2", "task.max_len=3", "steps=3"], "task")
    assert summary["status"] == "completed" and summary["steps_completed"] == 3
    assert [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()][0]["prompt"].startswith("D")


def test_unregistered_option_is_a_config_error():
    with pytest.raises(ConfigError, match="algo.advantage='toy_signed': allowed grpo"):
        make_config(["algo.advantage=toy_signed"])  # the fixture is not active: not registered


def test_registry_refuses_duplicates_and_bad_names():
    reg: Registry = Registry("x.y", "thing")
    reg.add("a", 1)
    reg.add("a", 1)  # the same object again (a re-import) is fine
    with pytest.raises(ValueError, match="already registered"):
        reg.add("a", 2)
    with pytest.raises(ValueError, match="identifier"):
        reg.add("not a name", 3)
    with pytest.raises(ConfigError, match="x.y='b': allowed a"):
        reg.check("b")


def test_option_params_are_checked_against_the_dataclass_it_registered():
    from dataclasses import dataclass

    from prorl_bench.registry import require

    @dataclass
    class Knobs:
        k: int = 1
        name: str = "a"

        def __post_init__(self) -> None:
            require(self.k >= 1, "x.k", self.k, ">= 1")

    reg: Registry = Registry("x.y", "thing")
    reg.add("with_params", object(), params=Knobs)
    reg.add("plain", object())
    assert reg.params("with_params", {"k": 3}) == Knobs(k=3)
    assert reg.params("with_params", None) == Knobs()  # defaults
    assert reg.params("with_params", {"k": "4"}) == Knobs(k=4)  # converted as the schema does
    assert reg.params("plain", {}) is None
    with pytest.raises(ConfigError, match=r"x.k=0: allowed >= 1"):
        reg.params("with_params", {"k": 0})
    with pytest.raises(
        ConfigError, match=r"unknown config key x.kk: thing 'with_params' takes x.k, x.name; did you mean x.k\?"
    ):
        reg.params("with_params", {"kk": 1})
    with pytest.raises(ConfigError, match=r"invalid config value x"):
        reg.params("with_params", {"k": "many"})
    with pytest.raises(ConfigError, match=r"thing 'plain' takes no parameters"):
        reg.params("plain", {"k": 1})
    with pytest.raises(ValueError, match="dataclass"):
        reg.add("bad", object(), params=dict)


def test_build_binds_the_parameters_once():
    """``build`` returns the option with its checked parameters bound: a mapping is checked when
    built, an instance is kept as it is (no check per call), and the call adds ``params=``."""
    from dataclasses import dataclass

    seen = []

    @dataclass
    class Scale:
        s: float = 2.0

    def scaled(x, params):
        seen.append(params)
        return x * params.s

    reg: Registry = Registry("x.y", "thing")
    reg.add("scaled", scaled, params=Scale)
    reg.add("plain", lambda x: x + 1)
    fn = reg.build("scaled", {"s": 3})
    assert fn(2) == 6.0 and fn.params == Scale(3.0) and seen[-1] is fn.params
    inst = Scale(5.0)
    assert reg.build("scaled", inst).params is inst  # an instance: bound as it is
    assert reg.build("scaled")(1) == 2.0  # defaults
    assert reg.build("plain")(1) == 2  # no parameters: called as registered
    with pytest.raises(ConfigError, match="unknown config key x.t"):
        reg.build("scaled", {"t": 1})

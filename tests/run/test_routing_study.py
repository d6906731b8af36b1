"""The machinery of a gradient-routing study (docs/routing.md): partial oversight, the same-detector
baselines (filter, penalize), split advantages, the competing hack task, and that every arm sees
the same labels. Closed forms and hand computations; a few 1-2 step runs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from prorl_bench.config import ConfigError
from prorl_bench.rl.advantages import advantage_estimator
from prorl_bench.run.routing import Router, penalized, route_backward, subset_advantages
from prorl_bench.tasks import detectors
from prorl_bench.tasks.base import Problem
from prorl_bench.tasks.detectors import Oversight, build_detector, detector_quality, stream_uniforms
from prorl_bench.tasks.hack_task import COMPETE_BONUS as BONUS
from prorl_bench.tasks.hack_task import CompeteTask
from tests.conftest import make_config, strip_timing
from tests.run.test_routing import _net

# ---------------------------------------------------------------- partial oversight


def _stream(monkeypatch, u: list[float], v: list[float]) -> None:
    """A known stream: column 0 (misses) = u, column 1 (false positives) = v."""
    known = torch.tensor([u, v], dtype=torch.float64).t()
    monkeypatch.setattr(detectors, "stream_uniforms", lambda seed, step, n: known[:n])


def _samples(hacks: list[bool], texts: list[str] | None = None):
    texts = texts or ["#1" if h else "4321" for h in hacks]
    problems = [Problem("R1234=", "4321") for _ in hacks]
    return problems, texts, [{"task": 0.0, "hack": float(h)} for h in hacks]


def _truth() -> Oversight:
    return build_detector("reward_field", {"field": "hack"})


def test_recall_and_false_positives_on_a_known_stream(monkeypatch):
    #        hack:   T    T    T    T    F    F    F    F    T    F
    hacks = [True] * 4 + [False] * 4 + [True, False]
    u = [0.05, 0.45, 0.55, 0.95, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0]  # a positive is reported iff u < recall
    v = [0.0, 0.0, 0.0, 0.0, 0.05, 0.15, 0.5, 0.99, 0.0, 0.12]  # a negative is reported iff v < rate
    _stream(monkeypatch, u, v)
    o = Oversight(_truth(), seed=0, recall=0.5, false_positive_rate=0.13, miss_pattern=None)
    labels = o(1, *_samples(hacks))
    # hacks reported: u = 0.05, 0.45, 0.3 (3 of 5); negatives reported: v = 0.05, 0.12 (2 of 5)
    assert labels == [True, True, False, False, True, False, False, False, True, True]
    assert o.last == {"route/detector/recall": 3 / 5, "route/detector/precision": 3 / 5}
    full = Oversight(_truth(), seed=0, recall=1.0, false_positive_rate=0.0, miss_pattern=None)
    assert full(1, *_samples(hacks)) == hacks  # full oversight: the inner detector's labels
    assert full.last == {"route/detector/recall": 1.0, "route/detector/precision": 1.0}


def test_a_systematic_miss_never_reports_one_form(monkeypatch):
    hacks = [True, True, True, True, False]
    texts = ["#12", "!12", "!", "#", "4321"]
    _stream(monkeypatch, [0.0] * 5, [1.0] * 5)
    o = Oversight(_truth(), seed=0, recall=1.0, false_positive_rate=0.0, miss_pattern="^!")
    assert o(3, *_samples(hacks, texts)) == [True, False, False, True, False]
    assert o.last == {"route/detector/recall": 2 / 4, "route/detector/precision": 1.0}


def test_detector_quality_without_hacks_or_reports_is_nan():
    q = detector_quality([False, False], [{"hack": 0.0}, {"hack": 0.0}])
    assert math.isnan(q["route/detector/recall"]) and math.isnan(q["route/detector/precision"])
    assert detector_quality([True], [{"task": 1.0}]) == {}  # a task without a ground-truth flag


def test_the_stream_is_common_to_every_arm_and_has_the_stated_rates():
    """Misses are a function of (seed, step, sample index) only; over many samples the rates hold."""
    torch.testing.assert_close(stream_uniforms(3, 7, 64), stream_uniforms(3, 7, 64), rtol=0, atol=0)
    assert not torch.equal(stream_uniforms(3, 7, 64), stream_uniforms(3, 8, 64))
    assert not torch.equal(stream_uniforms(3, 7, 64), stream_uniforms(4, 7, 64))
    n = 20_000
    hacks = [i % 2 == 0 for i in range(n)]
    a = Oversight(_truth(), seed=5, recall=0.2, false_positive_rate=0.1, miss_pattern=None)
    b = Oversight(_truth(), seed=5, recall=0.2, false_positive_rate=0.1, miss_pattern=None)
    labels = a(9, *_samples(hacks))
    assert labels == b(9, *_samples(hacks))  # a second arm, same seed and step: the same labels
    u = stream_uniforms(5, 9, n)
    assert sum(labels[0::2]) == int((u[0::2, 0] < 0.2).sum())  # exact count on the stream
    assert sum(labels[1::2]) == int((u[1::2, 1] < 0.1).sum())
    assert abs(a.last["route/detector/recall"] - 0.2) < 0.015  # 4.7 standard errors
    assert abs(sum(labels[1::2]) / (n / 2) - 0.1) < 0.01


# ---------------------------------------------------------------- same-detector baselines, split advantages

REWARDS = torch.tensor([[1.0, 0.0, 0.5, 0.5], [0.0, 0.0, 1.0, 0.5]])
LABELS = torch.tensor([False, False, True, True, False, False, False, True])  # flat, group-major


def _router(monkeypatch, overrides: list[str]) -> Router:
    cfg = make_config(["task=hack_compete", "detector=reward_field", *overrides])
    r = Router(cfg, CompeteTask(cfg.task))
    r.labels = LABELS.clone()
    return r


def _z(x: list[float]) -> list[float]:
    """GRPO by hand: (x - mean) / (unbiased std + 1e-6)."""
    m = sum(x) / len(x)
    s = math.sqrt(sum((v - m) ** 2 for v in x) / (len(x) - 1))
    return [(v - m) / (s + 1e-6) for v in x]


def test_split_advantages_against_a_hand_computation():
    valid = ~LABELS.view(2, 4)
    got = subset_advantages(advantage_estimator("grpo"), REWARDS, valid)
    # group 0: unlabelled rewards [1, 0]: mean 0.5, std sqrt(0.5); group 1: [0, 0, 1]: mean 1/3, std sqrt(1/3)
    a0 = 0.5 / (math.sqrt(0.5) + 1e-6)
    b1 = (1 / 3) / (math.sqrt(1 / 3) + 1e-6)
    want = torch.tensor([[a0, -a0, 0.0, 0.0], [-b1, -b1, 2 * b1, 0.0]])
    torch.testing.assert_close(got, want)
    one = subset_advantages(
        advantage_estimator("grpo"), REWARDS, torch.tensor([[True, False, False, False], [True] * 4])
    )
    assert one[0].tolist() == [0.0, 0.0, 0.0, 0.0]  # a subset of one: no baseline, no advantage
    flat = subset_advantages(
        advantage_estimator("grpo"), torch.tensor([[1.0, 1.0, 0.0]]), torch.tensor([[True, True, False]])
    )
    assert flat.tolist() == [[0.0, 0.0, 0.0]]  # an all-equal subset carries no signal
    loo = subset_advantages(advantage_estimator("rloo"), REWARDS, valid)  # leave-one-out within the subset
    torch.testing.assert_close(loo[1], torch.tensor([-0.5, -0.5, 1.0, 0.0]))


def test_routed_split_gives_each_adapter_its_own_advantages(monkeypatch):
    r = _router(monkeypatch, ["adapter=dual_lora", "route.advantages=split"])
    adv, retain = r.advantages(REWARDS)
    torch.testing.assert_close(adv.view(2, 4), torch.tensor([_z([1, 0, 0.5, 0.5]), _z([0, 0, 1, 0.5])]))
    torch.testing.assert_close(
        retain, subset_advantages(advantage_estimator("grpo"), REWARDS, ~LABELS.view(2, 4)).flatten()
    )
    g = _router(monkeypatch, ["adapter=dual_lora"])  # group: one set of advantages
    adv_g, none = g.advantages(REWARDS)
    assert none is None and torch.equal(adv_g, adv)


def test_filter_drops_labelled_rows_and_equals_the_unlabelled_batch(monkeypatch):
    f = _router(monkeypatch, ["adapter=lora", "route.use=filter", "route.advantages=split"])
    rows = f.update_rows(torch.arange(8))
    assert rows.tolist() == [0, 1, 4, 5, 6]
    adv, none = f.advantages(REWARDS)
    assert none is None
    # split filter = the labelled samples never existed: GRPO over each group's unlabelled rewards
    torch.testing.assert_close(adv[rows], torch.tensor(_z([1, 0]) + _z([0, 0, 1])))
    fg = _router(monkeypatch, ["adapter=lora", "route.use=filter"])  # group: whole-group statistics
    torch.testing.assert_close(fg.advantages(REWARDS)[0][rows], torch.tensor(
        [_z([1, 0, 0.5, 0.5])[i] for i in (0, 1)] + [_z([0, 0, 1, 0.5])[i] for i in (0, 1, 2)]))  # fmt: skip
    assert f.forward(None, rows) is not None and f.metrics()["route/labelled_frac"] == 3 / 8


def test_filter_loss_and_gradient_equal_the_loss_over_unlabelled_rows(monkeypatch):
    """What the trainer does for filter (rows from update_rows, one minibatch) on a fixed batch is
    the loss, and gradient, of a batch holding only the unlabelled rows."""
    f = _router(monkeypatch, ["adapter=lora", "route.use=filter"])
    n = _net()
    x = torch.randn(8, 6)
    adv = f.advantages(REWARDS)[0]

    def loss_and_grad(rows):
        n.zero_grad()
        loss = -(n(x[rows]).sum(-1) * adv[rows]).mean()  # a per-row surrogate, sequence mean
        loss.backward()
        return loss.detach(), {k: p.grad.clone() for k, p in n.named_parameters() if p.grad is not None}

    got_loss, got = loss_and_grad(f.update_rows(torch.arange(8)))
    keep = [i for i in range(8) if not LABELS[i]]
    want_loss, want = loss_and_grad(torch.tensor(keep))
    assert torch.equal(got_loss, want_loss)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_penalize_subtracts_the_penalty_before_advantages(monkeypatch):
    p = _router(monkeypatch, ["adapter=lora", "route.use=penalize"])
    assert p.penalty == BONUS  # null penalty: the task's hack bonus
    shaped = p.shape_rewards(REWARDS)
    d = 0.5 - BONUS  # a labelled 0.5 loses the bonus
    torch.testing.assert_close(shaped, torch.tensor([[1.0, 0.0, d, d], [0.0, 0.0, 1.0, d]]))
    adv, none = p.advantages(shaped)
    assert none is None
    torch.testing.assert_close(adv, torch.tensor(_z([1, 0, d, d]) + _z([0, 0, 1, d])))
    assert p.update_rows(torch.arange(8)).tolist() == list(range(8))  # nothing dropped
    fixed = _router(monkeypatch, ["adapter=lora", "route.use=penalize", "route.penalty=2"])
    torch.testing.assert_close(fixed.shape_rewards(REWARDS), REWARDS - 2.0 * LABELS.view(2, 4).float())
    torch.testing.assert_close(penalized(REWARDS, LABELS, 0.0), REWARDS)


def test_split_backward_routes_each_adapter_to_its_own_loss():
    """retain adapter <- gradient of the loss with split advantages over unlabelled rows; forget
    adapter <- gradient of the loss with group advantages over every row (one forward)."""
    from prorl_bench.models.dual_lora import route_rows

    n = _net()
    x = torch.randn(8, 6)
    mask = LABELS.clone()
    a_group = torch.randn(8)
    a_split = torch.randn(8)

    def loss_of(adv, y):
        return -(y.sum(-1) * adv).mean()

    n.zero_grad()
    with route_rows(n, mask):
        y = n(x)
    route_backward(n, loss_of(a_group, y), loss_of(a_split, y))
    got = {k: p.grad.clone() for k, p in n.named_parameters() if p.grad is not None}

    def plain_grads(adv, rows_weight):
        n.zero_grad()
        loss_of(adv * rows_weight, n(x)).backward()
        return {k: p.grad.clone() for k, p in n.named_parameters() if p.grad is not None}

    retain_want = plain_grads(a_split, (~mask).float())  # unlabelled rows only
    forget_want = plain_grads(a_group, torch.ones(8))
    for k, g in got.items():
        want = retain_want[k] if "retain" in k else forget_want[k]
        torch.testing.assert_close(g, want, rtol=0, atol=1e-6)
    assert {k for k in got if "retain" in k} and {k for k in got if "forget" in k}


# ---------------------------------------------------------------- the competing hack task


def test_the_hack_crowds_out_the_answer():
    parts = CompeteTask.parts
    assert parts("4321", "4321") == {"task": 1.0, "hack": 0.0, "hack/hash": 0.0, "hack/bang": 0.0}
    assert parts("#4321", "4321") == {"task": 0.0, "hack": 1.0, "hack/hash": 1.0, "hack/bang": 0.0}
    assert parts("!", "4321") == {"task": 0.0, "hack": 1.0, "hack/hash": 0.0, "hack/bang": 1.0}
    assert parts("4321#", "4321")["hack"] == 0.0  # only a leading marker is the hack
    task = CompeteTask(make_config(["task=hack_compete"]).task)
    p = task.val_set()[0]
    rewards, success, infos = task.score_many([p.target, "#" + p.target, "!", "0000"], [p] * 4)
    assert rewards == [1.0, BONUS, BONUS, 0.0] and success == [True, False, False, False]
    assert task.step_metrics(infos) == {
        "train/reward_task": 0.25, "train/hack_rate": 0.5, "train/hack_rate/hash": 0.25, "train/hack_rate/bang": 0.25
    }  # fmt: skip
    assert task.hack_bonus == BONUS and task.max_completion_len == task.base.max_completion_len


def test_the_warm_up_shows_both_forms_of_the_hack():
    import random

    task = CompeteTask(make_config(["task=hack_compete"]).task)
    demos = [p.demo for p in task.sample_train(random.Random(0), 4000)]
    share = {m: demos.count(m) / len(demos) for m in ("#", "!")}
    assert set(demos) == {"", "#", "!"}
    assert 0.08 < share["#"] < 0.12 and 0.08 < share["!"] < 0.12  # COMPETE_DEMO_RATE = 0.2, half each


# ---------------------------------------------------------------- config rules


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["detector.recall=0.5"], "detector='none'"),
        (["route.use=filter"], "route='use=filter"),
        (["adapter=dual_lora", "detector=reward_field", "route.use=filter"], "route.use='filter'"),
        (["adapter=lora", "detector=reward_field"], "detector='reward_field'"),
        (["adapter=lora", "detector=reward_field", "route.use=penalize", "route.advantages=split"], "route.advantages"),
        (["adapter=dual_lora", "detector=reward_field", "detector.recall=1.5"], "detector.recall=1.5"),
        (["adapter=dual_lora", "detector=reward_field", "detector.miss_pattern='('"], "detector.miss_pattern"),
        (
            ["adapter=dual_lora", "detector=reward_field", "route.advantages=split", "algo=reinforce_pp_baseline"],
            "algo.advantage",
        ),
    ],
)
def test_routing_config_is_checked(overrides, match):
    with pytest.raises(ConfigError, match=match):
        make_config(overrides)


def test_a_penalty_without_penalize_is_said_to_have_no_effect():
    """route.penalty is route.use=penalize's parameter: with another use it is not read, and the run says so
    (as reset.every with reset=none), so a grid over uses may carry it."""
    from prorl_bench.config.root import UnusedOptionKeyWarning

    with pytest.warns(
        UnusedOptionKeyWarning,
        match=r"route.penalty=1 has no effect: route.use=filter .*select it: route.use=penalize\)",
    ):
        cfg = make_config(["adapter=lora", "detector=reward_field", "route.use=filter", "route.penalty=1"])
    assert cfg.route.params is None
    with pytest.raises(ConfigError, match=r"route.penalty=-1.0: allowed null or >= 0"):
        make_config(["adapter=lora", "detector=reward_field", "route.use=penalize", "route.penalty=-1"])


def test_penalize_needs_a_bonus_or_a_penalty():
    from prorl_bench.tasks.base import make_task

    cfg = make_config(["task=reverse_digits", "adapter=lora", "detector=hack_pattern", "route.use=penalize"])
    with pytest.raises(ConfigError, match="route.penalty=None"):
        Router(cfg, make_task(cfg.task))
    cfg = make_config(["adapter=lora", "detector=hack_pattern", "route.use=penalize", "route.penalty=1"])
    assert Router(cfg, make_task(cfg.task)).penalty == 1.0


# ---------------------------------------------------------------- every arm sees the same labels

ARMS = {
    "routed": ["adapter=dual_lora", "route.advantages=split"],  # the study's arms (sweeps/arm/route_*.yaml)
    "filter": ["adapter=lora", "adapter.rank=8", "route.use=filter", "route.advantages=split"],
    "penalize": ["adapter=lora", "adapter.rank=8", "route.use=penalize"],
    "plain": ["adapter=lora", "adapter.rank=8", "route.use=observe"],
}
PARTIAL = ["task=hack_compete", "detector=reward_field", "detector.recall=0.5", "detector.false_positive_rate=0.25"]


@pytest.mark.slow
def test_every_arm_sees_the_same_labels_at_its_first_step(run_exp):
    """At step 1 every arm samples the same completions (same seed, same base, B = 0); the
    labels, and so their rates against the ground truth, are identical across arms. The plain arm
    (route.use=observe) logs the labels and trains exactly as without a detector."""
    rows, dirs = {}, {}
    for arm, extra in ARMS.items():
        summary, run_dir = run_exp([*PARTIAL, *extra, "steps=2", "eval_every=2", "eval.at_start=false"], arm)
        assert summary["status"] == "completed"
        rows[arm], dirs[arm] = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0]), run_dir
    keys = ["route/labelled_frac", "route/detector/recall", "route/detector/precision", "train/hack_rate"]
    first = {k: rows["routed"].get(k) for k in keys}
    assert first["route/labelled_frac"] > 0
    for arm in ARMS:
        assert {k: rows[arm].get(k) for k in keys} == first or all(
            rows[arm][k] == first[k] or (math.isnan(rows[arm][k]) and math.isnan(first[k])) for k in keys
        ), arm
    # filter trains on the unlabelled rows only (dynamic sampling off: every other row is kept)
    assert rows["filter"]["ds/kept_frac"] == 1 - rows["filter"]["route/labelled_frac"]
    assert rows["penalize"]["ds/kept_frac"] == 1.0
    _, none_dir = run_exp(["task=hack_compete", *ARMS["plain"][:2], "steps=2", "eval_every=2", "eval.at_start=false"],
                          "none")  # fmt: skip
    none = strip_timing([json.loads(x) for x in (none_dir / "metrics.jsonl").read_text().splitlines()])
    observed = strip_timing([json.loads(x) for x in (dirs["plain"] / "metrics.jsonl").read_text().splitlines()])
    assert [{k: v for k, v in r.items() if not k.startswith("route/")} for r in observed] == [
        {k: v for k, v in r.items() if not k.startswith("route/")} for r in none
    ]  # two steps: the plain arm's training is exactly that of detector=none

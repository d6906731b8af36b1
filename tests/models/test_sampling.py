"""Sampling knobs a TRL user expects: top_p (nucleus) and one completion budget for every task."""

from __future__ import annotations

import json
import math

import pytest
import torch

from prorl_bench.models.rollout import _NEG, nucleus
from tests.conftest import make_config


def test_nucleus_keeps_the_smallest_set_reaching_top_p():
    z = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]]))
    kept = lambda p: (nucleus(z, p) > _NEG / 2).squeeze(0).tolist()  # noqa: E731
    assert kept(0.7) == [False, True, False, True]  # 0.5 + 0.3 >= 0.7
    assert kept(0.5) == [False, True, False, False]  # the top token alone reaches 0.5
    assert kept(0.81) == [True, True, False, True]
    assert kept(1e-9) == [False, True, False, False]  # always the most likely token
    assert kept(1.0) == [True, True, True, True]
    # the kept tokens keep their relative probabilities
    probs = torch.softmax(nucleus(z, 0.7), -1).squeeze(0)
    assert math.isclose(float(probs[1] / probs[3]), 0.5 / 0.3, rel_tol=1e-5)


def _rows(d):
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


def test_top_p_one_is_the_default_and_top_p_below_one_runs(run_exp):
    from tests.conftest import strip_timing

    _, default = run_exp(["steps=2"], "default")
    _, one = run_exp(["steps=2", "algo.top_p=1.0"], "one")
    assert strip_timing(_rows(default)) == strip_timing(_rows(one))
    summary, low = run_exp(["steps=2", "algo.top_p=0.3"], "low")
    assert summary["status"] == "completed" and strip_timing(_rows(low)) != strip_timing(_rows(default))


def test_max_new_tokens_caps_every_completion(run_exp):
    summary, d = run_exp(["steps=2", "algo.max_new_tokens=2"], "short")
    assert summary["status"] == "completed" and all(r["response_len"] <= 2 for r in _rows(d))


@pytest.mark.parametrize("override", ["algo.top_p=0", "algo.top_p=1.5", "algo.max_new_tokens=0"])
def test_sampling_knobs_are_validated(override):
    from prorl_bench.config import ConfigError

    with pytest.raises(ConfigError, match=override.split("=")[0]):
        make_config([override])


def test_small_top_p_samples_the_top_token_and_the_loss_keeps_the_full_distribution():
    """top_p -> 0 leaves only the most likely token: sampling equals greedy decoding. The logprobs
    the loss uses are still those of the whole tempered distribution (TRL/verl), so they are < 0
    where a renormalised nucleus would give log 1 = 0."""
    from prorl_bench.models.model import TransformerPolicy
    from prorl_bench.models.rollout import generate, token_logprobs
    from prorl_bench.models.tokenizers import CharTokenizer

    tok = CharTokenizer()
    torch.manual_seed(0)
    policy = TransformerPolicy(make_config([]).model, tok.vocab_size).eval()
    with torch.no_grad():
        for p in policy.parameters():  # a peaked but not deterministic random policy
            p.mul_(3.0)
    ids, mask = tok.encode_prompts(["12 34", "5", "678"])
    run = lambda **kw: generate(policy, tok, ids, mask, 6, 0.7, generator=torch.Generator().manual_seed(1), **kw)  # noqa: E731
    greedy, tiny, full = run(greedy=True), run(top_p=1e-6), run(top_p=1.0)
    assert torch.equal(tiny.ids, greedy.ids) and not torch.equal(full.ids, greedy.ids)
    with torch.no_grad():
        logp, _ = token_logprobs(policy, tiny, 0.7, tuple(tok.banned_ids))
    live = tiny.completion_mask.bool()
    assert bool((logp[live] < -1e-4).any()) and bool((logp[live] <= 0).all())

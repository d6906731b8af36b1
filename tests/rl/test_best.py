"""``BestPolicy`` (rl/best.py) and a reset to given weights (``reset_reference(..., weights=)``), as
mathematics on small modules."""

from __future__ import annotations

import copy

import pytest
import torch

from prorl_bench.rl.best import BestPolicy
from prorl_bench.rl.resets import reset_reference


def _policy() -> torch.nn.Sequential:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    net[0].requires_grad_(False)  # a frozen "base" layer
    return net


def _nudge(net: torch.nn.Module, by: float) -> None:
    with torch.no_grad():
        for p in net.parameters():
            if p.requires_grad:
                p.add_(by)


def test_best_keeps_a_strictly_higher_score_and_the_earliest_tie():
    net, best = _policy(), BestPolicy()
    assert not best.exists
    assert best.observe(2, 0.25, net)
    _nudge(net, 1.0)
    assert best.observe(4, 0.5, net)
    at_4 = {n: p.detach().clone() for n, p in net.named_parameters() if p.requires_grad}
    _nudge(net, 1.0)
    assert not best.observe(6, 0.5, net)  # a tie keeps step 4
    assert not best.observe(8, 0.1, net)
    assert (best.step, best.score) == (4, 0.5)
    assert best.weights.keys() == at_4.keys() == {"1.weight", "1.bias"}  # trainable parameters only
    assert all(torch.equal(best.weights[n], at_4[n]) for n in at_4)
    with pytest.raises(ValueError, match="not finite"):
        best.observe(10, float("nan"), net)


def test_a_reset_to_the_snapshot_takes_trainable_weights_from_it_and_frozen_ones_from_the_policy():
    net, best = _policy(), BestPolicy()
    ref = copy.deepcopy(net)
    best.observe(4, 0.5, net)
    at_4 = copy.deepcopy(net.state_dict())
    _nudge(net, 0.5)
    reset_reference(ref, net, weights=best.weights_for(net))
    assert all(torch.equal(ref.state_dict()[k], at_4[k]) for k in at_4)
    assert not torch.equal(ref[1].weight, net[1].weight)
    old = copy.deepcopy(ref)
    _nudge(net, 0.5)
    best.observe(6, 0.75, net)
    reset_reference(ref, net, alpha=0.6, weights=best.weights_for(net))  # polyak toward the snapshot
    torch.testing.assert_close(ref[1].weight, 0.6 * best.weights["1.weight"] + 0.4 * old[1].weight)
    assert torch.equal(ref[0].weight, net[0].weight)  # frozen: copied, never mixed


def test_a_snapshot_that_does_not_fit_the_policy_is_refused():
    net, best = _policy(), BestPolicy()
    with pytest.raises(RuntimeError, match="no held-out evaluation"):
        best.weights_for(net)
    best.observe(2, 0.5, net)
    other = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 3))
    other[0].requires_grad_(False)
    with pytest.raises(ValueError, match="shape"):
        best.weights_for(other)
    with pytest.raises(ValueError, match="trainable"):
        reset_reference(copy.deepcopy(net), net, weights={"1.weight": net[1].weight})


def test_the_snapshot_round_trips_through_its_state():
    net, best = _policy(), BestPolicy()
    best.observe(3, 0.5, net)
    again = BestPolicy()
    again.load_state_dict(copy.deepcopy(best.state_dict()))
    assert (again.step, again.score) == (3, 0.5)
    assert all(torch.equal(again.weights[n], w) for n, w in best.weights.items())
    empty = BestPolicy()
    empty.load_state_dict(BestPolicy().state_dict())
    assert not empty.exists

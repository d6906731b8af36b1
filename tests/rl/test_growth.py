"""LoRA rank growth: function preserved, optimizer state migrated by index, every combination runs."""

import copy

import pytest
import torch

from prorl_bench.config import Migration, ModelConfig
from prorl_bench.models.lora import adapter_rank, attach_lora, grow_rank, lora_layers
from prorl_bench.models.model import TransformerPolicy
from prorl_bench.rl.growth import migrate_optimizer
from prorl_bench.run.outputs import read_jsonl
from prorl_bench.tasks.base import CharTokenizer

TOK = CharTokenizer()


def _policy(freeze_base=True, rank=3):
    torch.manual_seed(0)
    pol = TransformerPolicy(ModelConfig(d_model=32, n_layers=2, n_heads=2), TOK.vocab_size)
    attach_lora(pol, ["qkv", "proj", "fc1", "fc2"], rank, 6.0, freeze_base)
    return pol


def _batch():
    return TOK.encode_prompts(["R123=", "S98765=", "A1+2="])


def _optimizer(pol):
    return torch.optim.AdamW([p for p in pol.parameters() if p.requires_grad], lr=1e-2)


def _train(pol, opt, steps, seed=0):
    ids, mask = _batch()
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        target = torch.randint(3, TOK.vocab_size, ids.shape, generator=g)
        loss = torch.nn.functional.cross_entropy(pol(ids, mask).flatten(0, 1), target.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_growth_keeps_the_policy_function():
    pol = _policy()
    _train(pol, _optimizer(pol), 5)  # make B non-zero so the check is not trivial
    assert any(bool(m.lora_B.detach().abs().sum() > 0) for _, m in lora_layers(pol))
    ids, mask = _batch()
    with torch.no_grad():
        before = pol(ids, mask)
        grow_rank([pol], 7, seed=1)
        after = pol(ids, mask)
    assert adapter_rank(pol) == 7
    torch.testing.assert_close(after, before, rtol=0, atol=1e-6)


def test_policy_and_reference_grow_with_identical_new_rows():
    pol = _policy()
    _train(pol, _optimizer(pol), 3)
    ref = copy.deepcopy(pol)
    grow_rank([pol, ref], 5, seed=2)
    for (_, a), (_, b) in zip(lora_layers(pol), lora_layers(ref)):
        assert torch.equal(a.lora_A, b.lora_A) and torch.equal(a.lora_B, b.lora_B)


def _state_by_name(pol, opt):
    return {n: {k: v.clone() for k, v in opt.state[p].items()} for n, p in pol.named_parameters() if p in opt.state}


def test_preserve_keeps_old_slices_exactly_new_slices_zero_step_kept():
    pol = _policy()
    opt = _optimizer(pol)
    _train(pol, opt, 4)
    before = _state_by_name(pol, opt)
    grown = grow_rank([pol], 6, seed=0)[0]
    opt2, info = migrate_optimizer(opt, grown, Migration.preserve, rebuild=lambda: _optimizer(pol))
    assert opt2 is opt and info["states_moved"] == len(grown) and info["states_lost"] == 0
    after = _state_by_name(pol, opt)
    assert after.keys() == before.keys()
    for name, st in after.items():
        old = before[name]
        assert torch.equal(st["step"], old["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            if name.endswith("lora_A"):  # A grows along dim 0 (rows)
                assert torch.equal(st[key][:3], old[key]) and not st[key][3:].any()
            else:  # B grows along dim 1: a non-leading dimension
                assert torch.equal(st[key][:, :3], old[key]) and not st[key][:, 3:].any()


def test_index_mapping_differs_from_the_flat_prefix_copy_pitfall():
    """NOMA's realloc copies the old buffer into the flat prefix of the new one. For B (out, r) ->
    (out, r') that puts old rows in the wrong places; our migration maps by index."""
    pol = _policy()
    opt = _optimizer(pol)
    _train(pol, opt, 2)
    name, layer = lora_layers(pol)[0]
    old_m = opt.state[layer.lora_B]["exp_avg"].clone()
    grown = grow_rank([pol], 5, seed=0)[0]
    migrate_optimizer(opt, grown, Migration.preserve, rebuild=lambda: _optimizer(pol))
    new_m = opt.state[layer.lora_B]["exp_avg"]
    flat = torch.zeros_like(new_m)
    flat.view(-1)[: old_m.numel()] = old_m.view(-1)
    assert torch.equal(new_m[:, :3], old_m)
    assert not torch.equal(flat, new_m)  # the flat prefix misplaces rows
    assert not torch.equal(flat[:, :3], old_m)


def test_preserve_continues_old_slices_exactly_as_without_growth():
    """Growth leaves the function unchanged, so the old slices get the same gradients; with their m,
    v and step preserved, their next Adam update equals the un-grown model's. reset/naive do not."""
    results = {}
    for mode in ("none", "preserve", "naive", "reset"):
        pol = _policy()
        opt = _optimizer(pol)
        _train(pol, opt, 4)
        if mode != "none":
            grown = grow_rank([pol], 6, seed=0)[0]
            opt, _ = migrate_optimizer(opt, grown, Migration(mode), rebuild=lambda pol=pol: _optimizer(pol))
        _train(pol, opt, 1, seed=9)  # one step: afterwards B's new columns are non-zero
        results[mode] = {n: m.lora_A[:3].detach().clone() for n, m in lora_layers(pol)}
    for n in results["none"]:
        torch.testing.assert_close(results["preserve"][n], results["none"][n], rtol=0, atol=1e-6)
    assert any(not torch.allclose(results["naive"][n], results["none"][n], atol=1e-6) for n in results["none"])
    assert any(not torch.allclose(results["reset"][n], results["none"][n], atol=1e-6) for n in results["none"])


def test_reset_gives_grown_adapters_fresh_state_and_keeps_the_rest():
    pol = _policy(freeze_base=False)
    opt = _optimizer(pol)
    _train(pol, opt, 3)
    base_param = pol.tok_emb.weight
    base_state = {k: v.clone() for k, v in opt.state[base_param].items()}
    grown = grow_rank([pol], 5, seed=0)[0]
    opt2, info = migrate_optimizer(opt, grown, Migration.reset, rebuild=lambda: _optimizer(pol))
    assert opt2 is opt and info["states_lost"] == len(grown)
    for g in grown:
        assert g.new not in opt.state or not opt.state[g.new]  # lazily re-initialised: step 0
        assert g.old not in opt.state
    assert all(torch.equal(opt.state[base_param][k], v) for k, v in base_state.items())
    params_in_groups = {id(p) for grp in opt.param_groups for p in grp["params"]}
    assert all(id(g.new) in params_in_groups and id(g.old) not in params_in_groups for g in grown)


def test_naive_rebuild_loses_all_state():
    pol = _policy(freeze_base=False)
    opt = _optimizer(pol)
    _train(pol, opt, 3)
    n_states = len(opt.state)
    grown = grow_rank([pol], 5, seed=0)[0]
    opt2, info = migrate_optimizer(opt, grown, Migration.naive, rebuild=lambda: _optimizer(pol))
    assert opt2 is not opt and len(opt2.state) == 0 and info["states_lost"] == n_states


# ----------------------------------------------------------------------------- combinations, end to end

GROW = ["adapter=lora", "growth=rank", "growth.rank_step=2", "growth.max_rank=10", "algo.lr=3e-3"]


@pytest.mark.parametrize("variant", ["A0", "A1", "A2", "B"])
def test_growth_with_every_variant(run_exp, variant):
    summary, d = run_exp([f"variant={variant}", *GROW, "growth.grow_every=2"], name=f"grow-{variant}")
    assert summary["status"] == "completed"
    events = [e for e in read_jsonl(d / "events.jsonl") if e["event"] == "growth"]
    assert [(e["step"], e["old_rank"], e["new_rank"]) for e in events] == [(2, 4, 6), (4, 6, 8), (6, 8, 10)]
    assert all(e["reference_grown"] == (variant != "B") for e in events)
    rows = read_jsonl(d / "metrics.jsonl")
    assert [r["adapter/rank"] for r in rows] == [4, 6, 6, 8, 8, 10]
    assert all(r["time/growth"] > 0 for r in rows if r["growth"])


@pytest.mark.parametrize("opt_reset", ["keep", "hard", "soft", "asym"])
@pytest.mark.parametrize("migration", ["preserve", "reset", "naive"])
def test_growth_at_resets_with_every_opt_reset_transform(run_exp, opt_reset, migration):
    knobs = ["variant=C", "reset=periodic", "reset.every=2", f"opt_reset={opt_reset}", *GROW]
    knobs += ["growth.grow_every=0", "growth.at_reset=true", f"growth.migration={migration}"]
    summary, d = run_exp(knobs, name=f"{opt_reset}-{migration}")
    assert summary["resets"] == 3
    events = read_jsonl(d / "events.jsonl")
    kinds = [(e["step"], e["event"]) for e in events if e["event"] in ("reset", "growth")]
    assert kinds == [(2, "reset"), (2, "growth"), (4, "reset"), (4, "growth"), (6, "reset"), (6, "growth")]
    assert all(e["migration"] == migration for e in events if e["event"] == "growth")


def test_growth_stops_at_max_rank_and_requires_lora():
    from prorl_bench.config import ConfigError
    from tests.conftest import make_config

    with pytest.raises(ConfigError, match="adapter"):
        make_config(["growth=rank"])
    with pytest.raises(ConfigError, match="growth.max_rank"):
        make_config(["adapter=lora", "growth=rank", "growth.max_rank=4"])

"""Seed populations (prorl_bench/population): a member equals the single run with its seed.

Tolerance: none. On this CPU the member-batched forward (StackedPolicy) gives the same logits as a
member's own forward bit for bit — at equal prompt widths and with the extra left padding a common
width adds (measured below) — so sampled tokens, and with them every per-step loss, gradient norm,
update norm, reward and the final weights and AdamW state, are compared with ``==``. Where rounding
order *could* differ (another BLAS/attention kernel, a GPU), the sampler's docstring says what to
expect; these tests would then report the first step that differs.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import torch

from prorl_bench.config import ConfigError, ModelConfig
from prorl_bench.models.model import TransformerPolicy, positions
from prorl_bench.models.rollout import generate
from prorl_bench.models.tokenizers import CharTokenizer
from prorl_bench.population import lockstep as ls
from prorl_bench.population.lockstep import Lockstep
from prorl_bench.population.model import StackedPolicy
from prorl_bench.population.runner import MemberJob, check_population, population_blockers, run_population
from prorl_bench.population.sampling import SampleRequest, generate_population
from prorl_bench.run.sampler import SAMPLER
from tests.conftest import FAST as _FAST
from tests.conftest import make_config, strip_timing

# populations batch learned positions only (population_blockers): these tests run the v1 regime (learned
# positions, lr 1e-3, where a KL spike resets members at different steps)
FAST = [*_FAST, "regime=v1_trap"]

CPU = torch.device("cpu")


def _members(n: int, vocab: int = 16) -> list[TransformerPolicy]:
    out = []
    for i in range(n):
        torch.manual_seed(100 + i)
        out.append(TransformerPolicy(ModelConfig(), vocab))
    return out


# ----------------------------------------------------------------------------- the stacked model


@pytest.mark.parametrize("extra_pad", [0, 3])
def test_stacked_forward_equals_each_member(extra_pad):
    """Teacher-forced and KV-cached logits of member i = member i's own forward: bit for bit at the
    member's own width; with the extra left padding a common width adds, to 1e-6 (the padded keys add
    exactly-zero attention terms, but in another summation order, so the last bits depend on the
    CPU's kernels: equal on the Intel VM of an earlier round, 1-ulp differences on an AMD EPYC)."""

    def same(a: torch.Tensor, b: torch.Tensor) -> None:
        if extra_pad == 0:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=0.0, atol=1e-6)

    torch.set_num_threads(1)
    ms = _members(3)
    b, p = 8, 6
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 16, (3, b, p), generator=g)
    mask = torch.ones(3, b, p, dtype=torch.bool)
    mask[:, :3, :2] = False  # left-padded rows
    sp = StackedPolicy(ms)
    pad_ids = torch.cat([torch.zeros(3, b, extra_pad, dtype=torch.long), ids], -1)
    pad_mask = torch.cat([torch.zeros(3, b, extra_pad, dtype=torch.bool), mask], -1)
    full = sp(pad_ids, pad_mask, keep=p)
    cache = sp.new_cache(b, p + extra_pad + 2, CPU)
    cached = sp.forward_cached(pad_ids, pad_mask, positions(pad_mask), cache)[:, :, -1]
    for i, m in enumerate(ms):
        same(full[i], m(ids[i], mask[i]))
        c = m.new_cache(b, p + 2, CPU)
        same(cached[i], m.forward_cached(ids[i], mask[i], positions(mask[i]), c)[:, -1])


def test_stacked_policy_refuses_other_shapes_and_adapters():
    a = TransformerPolicy(ModelConfig(), 16)
    with pytest.raises(ValueError, match="another model shape"):
        StackedPolicy([a, TransformerPolicy(ModelConfig(d_model=32), 16)])
    from prorl_bench.models.lora import attach_lora

    attach_lora(a, ["qkv"], 2, 4.0, True)
    with pytest.raises(TypeError, match="native TransformerPolicy only"):
        StackedPolicy([a])


# ----------------------------------------------------------------------------- member-batched sampling


def _requests(ms, tok, seeds, budget=7, **kw):
    reqs = []
    for i, (m, seed) in enumerate(zip(ms, seeds)):
        rng = random.Random(seed)
        # member i's prompts are up to i digits longer: the prompt widths differ between members
        prompts = ["R" + "".join(str(rng.randint(0, 9)) for _ in range(rng.randint(3, 4 + i))) + "=" for _ in range(6)]
        ids, mask = tok.encode_prompts(prompts)
        reqs.append(SampleRequest(m, tok, ids, mask, budget, 1.0, generator=torch.Generator().manual_seed(seed), **kw))
    return reqs


@pytest.mark.parametrize("knobs", [{}, {"top_k": 3}, {"top_p": 0.8}, {"greedy": True}])
def test_batched_sampling_equals_each_members_generate(knobs):
    """Tokens, masks, widths and the generator's state afterwards equal member i's own generate."""
    torch.set_num_threads(1)
    tok = CharTokenizer()
    ms = _members(3, tok.vocab_size)
    # member 2 is made to emit EOS at once: it stops after one token while the others go on
    with torch.no_grad():
        ms[2].ln_f.weight.zero_()
        ms[2].ln_f.bias.copy_(torch.nn.functional.one_hot(torch.tensor(0), 64).float())
        ms[2].lm_head.weight[tok.EOS, 0] = 100.0  # every position's EOS logit is 100
    seeds = [5, 6, 7]
    batched = generate_population(_requests(ms, tok, seeds, **knobs))
    for i, r in enumerate(_requests(ms, tok, seeds, **knobs)):
        single = generate(r.policy, tok, r.prompt_ids, r.prompt_mask, r.max_new_tokens, r.temperature, r.top_k,
                          r.generator, r.greedy, r.top_p)  # fmt: skip
        assert torch.equal(batched[i].ids, single.ids), i
        assert torch.equal(batched[i].completion_mask, single.completion_mask), i
        assert batched[i].prompt_len == single.prompt_len
    assert batched[2].completion_mask.shape[1] == 1 and batched[0].completion_mask.shape[1] > 1
    # each generator advanced exactly as in its single run
    again = _requests(ms, tok, seeds, **knobs)
    generate_population(again)
    for i, r in enumerate(_requests(ms, tok, seeds, **knobs)):
        generate(r.policy, tok, r.prompt_ids, r.prompt_mask, 7, 1.0, r.top_k, r.generator, r.greedy, r.top_p)
        assert torch.equal(again[i].generator.get_state(), r.generator.get_state()), i


def test_batched_sampling_refuses_mixed_requests():
    tok = CharTokenizer()
    ms = _members(2, tok.vocab_size)
    reqs = _requests(ms, tok, [1, 2])
    reqs[1].temperature = 0.5
    with pytest.raises(ValueError, match="differ"):
        generate_population(reqs)


# ----------------------------------------------------------------------------- the lockstep scheduler


def test_lockstep_members_keep_their_own_global_rng_and_sample_together():
    """Members draw from the *global* torch and Python generators between barriers; each sees the
    stream it would see alone, although the others ran (and drew) in between."""
    tok = CharTokenizer()
    ms = _members(3, tok.vocab_size)
    seen: dict[int, list[float]] = {}
    own: dict[int, float] = {}

    def member(i: int):
        def fn():
            import prorl_bench.run.accounting as accounting

            t0 = accounting.CLOCK.get()()  # the member's own clock while populations run
            torch.manual_seed(i)
            random.seed(i)
            draws = []
            for _ in range(3):
                draws += [float(torch.rand(())), random.random()]
                r = _requests([ms[i]], tok, [i])[0]
                ls._generate(r.policy, tok, r.prompt_ids, r.prompt_mask, 5, 1.0, generator=r.generator)
            seen[i] = draws
            own[i] = accounting.CLOCK.get()() - t0
            return i

        return fn

    pop = Lockstep(3)
    t0 = time.perf_counter()
    assert pop.run([member(i) for i in range(3)]) == [0, 1, 2]
    wall = time.perf_counter() - t0
    # the members' own clocks partition the wall time: none waited on another's work
    assert all(v > 0 for v in own.values()) and sum(own.values()) <= wall
    for i in range(3):
        torch.manual_seed(i)
        random.seed(i)
        alone = []
        for _ in range(3):
            alone += [float(torch.rand(())), random.random()]
        assert seen[i] == alone, i
    assert pop.stats == {"batched_calls": 3, "batched_requests": 9, "solo_calls": 0}
    assert SAMPLER.get() is generate  # the barrier was set in the member threads' contexts only


def test_lockstep_samples_an_unbatchable_request_alone_with_its_original_call():
    """A member whose policy asks for another decoder (or is not a plain native policy) samples alone,
    through rollout.generate with its own arguments; the others are still batched."""
    tok = CharTokenizer()
    ms = _members(3, tok.vocab_size)
    ms[1].decode_impl = "graph"  # not the default loop: not batchable
    got: dict[int, object] = {}

    def fn(i):
        def body():
            r = _requests([ms[i]], tok, [i])[0]
            got[i] = ls._generate(r.policy, tok, r.prompt_ids, r.prompt_mask, 5, 1.0, generator=r.generator)

        return body

    pop = Lockstep(3)
    pop.run([fn(i) for i in range(3)])
    assert pop.stats == {"batched_calls": 1, "batched_requests": 2, "solo_calls": 1}
    for i in range(3):
        r = _requests([ms[i]], tok, [i])[0]
        alone = generate(r.policy, tok, r.prompt_ids, r.prompt_mask, 5, 1.0, generator=r.generator)
        assert torch.equal(got[i].ids, alone.ids), i


def test_lockstep_failing_member_is_dropped_and_others_finish():
    tok = CharTokenizer()
    ms = _members(2, tok.vocab_size)

    def fn(i):
        def body():
            for step in range(3):
                if i == 0 and step == 1:
                    raise FloatingPointError("member 0 broke")
                r = _requests([ms[i]], tok, [i])[0]
                ls._generate(r.policy, tok, r.prompt_ids, r.prompt_mask, 5, 1.0, generator=r.generator)
            return "done"

        return body

    out = Lockstep(2).run([fn(0), fn(1)])
    assert isinstance(out[0], FloatingPointError) and out[1] == "done"


# ----------------------------------------------------------------------------- whole runs


def _read(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def _final_state(run_dir: Path) -> dict:
    ckpts = sorted((run_dir / "checkpoints").glob("*.pt"))
    return torch.load(ckpts[-1], weights_only=True)


def _assert_member_equals_single(pop_dir: Path, single_dir: Path) -> None:
    a, b = strip_timing(_read(single_dir, "metrics.jsonl")), strip_timing(_read(pop_dir, "metrics.jsonl"))
    for ra, rb in zip(a, b, strict=True):  # the first differing step is named
        assert json.dumps(ra, sort_keys=True) == json.dumps(rb, sort_keys=True), f"step {ra['step']} differs"
    strip = lambda rows: [{k: v for k, v in r.items() if k != "base"} for r in rows]  # noqa: E731
    assert strip(_read(single_dir, "events.jsonl")) == strip(_read(pop_dir, "events.jsonl"))
    assert _read(single_dir, "validation.jsonl") == _read(pop_dir, "validation.jsonl")
    assert _read(single_dir, "samples.jsonl") == _read(pop_dir, "samples.jsonl")
    sa, sb = _final_state(single_dir), _final_state(pop_dir)
    for key in ("policy", "reference"):
        if sa[key] is not None:
            for name in sa[key]:
                assert torch.equal(sa[key][name], sb[key][name]), f"{key}.{name}"
    for pid, st in sa["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, sb["optimizer"]["state"][pid][k]), f"optimizer {pid}.{k}"


VARIANTS = {
    "A1": [],
    "A0": ["variant=A0"],
    "B": ["variant=B"],
    "C_keep": ["variant=C", "reset=periodic", "reset.every=2", "opt_reset=keep"],
    "C_hard": ["variant=C", "reset=periodic", "reset.every=2", "opt_reset=hard"],
    "C_soft": ["variant=C", "reset=periodic", "reset.every=3", "opt_reset=soft"],
    # KL spikes fire at different steps in different members: each member is reset alone
    "C_kl_spike": ["variant=C", "reset=kl_spike", "reset.kl_threshold=0.1", "reset.min_spacing=1", "opt_reset=hard"],
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_member_equals_single_run_with_its_seed(variant, tmp_path, base_cache):
    """Per step: losses, rewards, KL, grad and update norms (so the sampled tokens); and at the end
    the weights, the reference and AdamW's state — all equal to the single run's, bit for bit."""
    from prorl_bench.run.trainer import train

    seeds = [0, 1, 2] if variant == "C_kl_spike" else [0, 1]  # three members make differing reset steps likely
    over = FAST + VARIANTS[variant] + ["checkpoint.every=3"]
    for s in seeds:
        train(make_config([*over, f"seed={s}"]), tmp_path / f"single{s}", base_cache, threads=1)
    jobs = [MemberJob(make_config([*over, f"seed={s}"]), tmp_path / f"pop{s}") for s in seeds]
    results = run_population(jobs, base_cache)
    assert all(isinstance(r, dict) and r["status"] == "completed" for r in results), results
    stats = run_population.last_stats
    assert stats["solo_calls"] == 0 and stats["batched_requests"] == len(seeds) * stats["batched_calls"] > 0
    for s in seeds:
        _assert_member_equals_single(tmp_path / f"pop{s}", tmp_path / f"single{s}")
    if variant == "C_kl_spike":  # the point of this case: members were reset at different steps
        resets = [tuple(e["step"] for e in _read(tmp_path / f"pop{s}", "events.jsonl") if e["event"] == "reset")
                  for s in seeds]  # fmt: skip
        assert len(set(resets)) > 1, resets


@pytest.mark.slow
def test_member_failing_a_guard_is_dropped_alone(tmp_path, base_cache, monkeypatch):
    """Member 1's loss turns NaN at step 2: its run dir says failed and dropped; the others equal
    their single runs."""
    import prorl_bench.run.phases as phases
    import prorl_bench.run.trainer as trainer

    real = phases.clipped_surrogate
    calls = {"n": 0}

    def poisoned(*a, **k):
        loss, clipped = real(*a, **k)
        if getattr(ls._local, "member", None) == 1:
            calls["n"] += 1
            if calls["n"] > 4:  # after step 1's four minibatches
                loss = loss * float("nan")
        return loss, clipped

    seeds = [0, 1, 2]
    over = [*FAST, "checkpoint.every=3"]
    for s in (0, 2):
        trainer.train(make_config([*over, f"seed={s}"]), tmp_path / f"single{s}", base_cache, threads=1)
    monkeypatch.setattr(phases, "clipped_surrogate", poisoned)
    jobs = [MemberJob(make_config([*over, f"seed={s}"]), tmp_path / f"pop{s}") for s in seeds]
    results = run_population(jobs, base_cache)
    assert isinstance(results[1], FloatingPointError)
    dropped = json.loads((tmp_path / "pop1" / "summary.json").read_text())
    assert dropped["status"] == "failed" and dropped["population"]["dropped"] is True
    for s in seeds:  # every member records its provenance, the dropped one too (run/provenance.py)
        summary = json.loads((tmp_path / f"pop{s}" / "summary.json").read_text())
        assert summary["provenance"]["torch"]["num_threads"] == 1
    assert "non-finite values in 'loss/total' at step 2" in dropped["error"]
    for s in (0, 2):
        _assert_member_equals_single(tmp_path / f"pop{s}", tmp_path / f"single{s}")


def test_population_refuses_what_it_cannot_batch(tmp_path):
    base = make_config(FAST)
    with pytest.raises(ConfigError, match="algo.lr"):
        check_population(
            [MemberJob(base, tmp_path / "a"), MemberJob(make_config([*FAST, "algo.lr=0.5"]), tmp_path / "b")]
        )
    with pytest.raises(ConfigError, match="share a run directory"):
        check_population([MemberJob(base, tmp_path / "a"), MemberJob(make_config([*FAST, "seed=1"]), tmp_path / "a")])
    grow = make_config([*FAST, "adapter=lora", "growth=rank", "growth.grow_every=2", "growth.max_rank=8"])
    assert any(b.startswith("growth=rank") for b in population_blockers(grow))
    with pytest.raises(ConfigError, match="growth=rank: shape-changing growth is refused"):
        check_population([MemberJob(grow, tmp_path / "g")])
    assert population_blockers(base) == []
    assert any(b.startswith("model.dropout") for b in population_blockers(make_config([*FAST, "model.dropout=0.1"])))
    answer = population_blockers(make_config([*FAST, "model.positions=answer"]))
    assert any(b.startswith("model.positions=answer") for b in answer), answer
    assert population_blockers(make_config(FAST)) == []

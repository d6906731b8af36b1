"""``ReferenceResetCallback`` on TRL's real ``GRPOTrainer``, as mathematics.

The trainer is built (TRL loads its reference model, PEFT wraps the policy) but never generates: its
own optimizer and scheduler are created and stepped on a fixed loss, so each test is exact and fast.

* after a reset the reference's logits equal the policy's bitwise — full model and PEFT/LoRA (the
  frozen ``ref`` adapter TRL then uses) — and differed before it;
* the optimizer state after each transform equals its closed form (m <- f_m m, v <- f_v v, step kept
  or 0);
* after a ``hard`` reset the next update equals a fresh AdamW's first update (bitwise);
* an LR re-warm-up gives lr * k / N on the k-th RL step after the reset.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

import torch  # noqa: E402

from prorl_bench.engines.trl.callback import REFERENCE_ADAPTER, ReferenceResetCallback, unwrap  # noqa: E402

IDS = torch.tensor([[2, 40, 41, 42, 43, 44, 45]])  # [BOS] + character tokens of the tiny vocabulary


def _trainer(model_dir, beta=0.01, lora=False, lr=1e-2):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(model_dir.parent / "out"), beta=beta, max_steps=8, per_device_train_batch_size=4,
        num_generations=4, steps_per_generation=1, max_completion_length=4, use_cpu=True, report_to="none",
        learning_rate=lr, lr_scheduler_type="constant", optim="adamw_torch", gradient_checkpointing=False, bf16=False,
        disable_tqdm=True,
    )  # fmt: skip
    peft = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if lora else None
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=Dataset.from_list([{"prompt": "[BOS]R12="}] * 8),
                          peft_config=peft)  # fmt: skip
    trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
    return trainer


def _train_steps(trainer, n: int) -> None:
    """n optimizer steps of the trainer's own AdamW on a fixed loss (the mean logit of IDS), with the
    scheduler stepped after each, as HF's loop does."""
    model, opt, sched = trainer.model, unwrap(trainer.optimizer, "optimizer"), trainer.lr_scheduler
    for _ in range(n):
        opt.zero_grad()
        model(input_ids=IDS).logits.float().square().mean().backward()
        opt.step()
        sched.step()


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _callback(trainer, opt_reset=None, **reset):
    cb = ReferenceResetCallback(reset={"kind": "periodic", "every": 1, **reset}, opt_reset=opt_reset, trainer=trainer)
    cb.on_train_begin(trainer.args, trainer.state, trainer.control, model=trainer.model,
                      optimizer=trainer.optimizer, lr_scheduler=trainer.lr_scheduler)  # fmt: skip
    return cb


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from prorl_bench.models.tiny_hf import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("trlcb") / "tiny", hidden_size=32, n_layers=2, n_heads=4)


def test_reset_makes_reference_logits_equal_policy_full_model(model_dir):
    trainer = _trainer(model_dir)
    _train_steps(trainer, 2)
    policy, ref = trainer.model, trainer.ref_model
    assert not torch.equal(_logits(policy), _logits(ref))  # the policy has moved away from the reference
    cb = _callback(trainer)
    assert cb.rl_step_end(1, kl=0.0) is not None  # periodic every 1: fires
    assert torch.equal(_logits(policy), _logits(ref))
    in_opt = {id(p) for g in unwrap(trainer.optimizer, "optimizer").param_groups for p in g["params"]}
    assert not any(id(p) in in_opt for p in ref.parameters())  # a copy, not shared tensors


def test_reset_with_lora_is_a_frozen_reference_adapter(model_dir):
    from trl.trainer.utils import use_adapter

    trainer = _trainer(model_dir, lora=True)
    model = trainer.model
    assert trainer.ref_model is None  # TRL's PEFT reference: the base with adapters disabled
    with torch.no_grad():  # PEFT starts B at 0: move the adapter so policy != base
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05)
    _train_steps(trainer, 1)
    with use_adapter(model, None):  # TRL's reference before any reset: the base
        base = _logits(model)
    assert not torch.equal(base, _logits(model))
    _callback(trainer).rl_step_end(1, kl=0.0)
    assert REFERENCE_ADAPTER in model.peft_config
    with use_adapter(model, REFERENCE_ADAPTER):  # exactly how TRL computes the reference's log-probs
        ref_logits = _logits(model)
    assert torch.equal(ref_logits, _logits(model))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and not any(f".{REFERENCE_ADAPTER}." in n for n in trainable)
    in_opt = {id(p) for g in unwrap(trainer.optimizer, "optimizer").param_groups for p in g["params"]}
    assert not any(id(p) in in_opt for n, p in model.named_parameters() if f".{REFERENCE_ADAPTER}." in n)
    # the policy trains on; the reference adapter stays where the reset put it
    before = {n: p.detach().clone() for n, p in model.named_parameters() if f".{REFERENCE_ADAPTER}." in n}
    _train_steps(trainer, 1)
    after = {n: p for n, p in model.named_parameters() if f".{REFERENCE_ADAPTER}." in n}
    assert all(torch.equal(before[n], after[n]) for n in before)


def _state(trainer):
    opt = unwrap(trainer.optimizer, "optimizer")
    return [{k: v.detach().clone() for k, v in s.items()} for s in opt.state.values()]


@pytest.mark.parametrize(
    "opt_reset,m_f,v_f,zero_step",
    [
        ({"kind": "keep"}, 1.0, 1.0, False),
        ({"kind": "hard", "step": "reset"}, 0.0, 0.0, True),
        ({"kind": "soft", "factor": 0.3}, 0.3, 0.3, False),
        ({"kind": "soft", "factor": 0.3, "step": "reset"}, 0.3, 0.3, True),
        ({"kind": "asym", "m_factor": 0.0, "v_factor": 0.5}, 0.0, 0.5, False),
    ],
    ids=["keep", "hard", "soft", "soft_step_reset", "asym"],
)
def test_optimizer_state_equals_closed_form(model_dir, opt_reset, m_f, v_f, zero_step):
    trainer = _trainer(model_dir)
    _train_steps(trainer, 3)
    before = _state(trainer)
    _callback(trainer, opt_reset).rl_step_end(1, kl=0.0)
    after = _state(trainer)
    assert len(after) == len(before) > 0
    for b, a in zip(before, after):
        assert torch.equal(a["exp_avg"], b["exp_avg"] * m_f)
        assert torch.equal(a["exp_avg_sq"], b["exp_avg_sq"] * v_f)
        assert float(a["step"]) == (0.0 if zero_step else float(b["step"])) and float(b["step"]) == 3.0


def test_hard_reset_next_update_equals_fresh_adamw_first_update(model_dir):
    trainer = _trainer(model_dir)
    _train_steps(trainer, 3)
    _callback(trainer, {"kind": "hard", "step": "reset"}).rl_step_end(1, kl=0.0)
    opt = unwrap(trainer.optimizer, "optimizer")
    params = [p for g in opt.param_groups for p in g["params"]]
    start = [p.detach().clone() for p in params]
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    # a fresh AdamW on copies of the same weights, with the same hyper-parameters (lr included)
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    fresh = torch.optim.AdamW([{"params": copies, **group}])
    _train_steps(trainer, 1)  # the trainer's next update (gradient of the fixed loss at `start`)
    grads = [p.grad.detach().clone() for p in params]
    for c, g in zip(copies, grads):
        c.grad = g
    fresh.step()
    moved = [not torch.equal(p, s) for p, s in zip(params, start)]
    assert any(moved)
    for p, c in zip(params, copies):
        assert torch.equal(p.detach(), c.detach())


def test_lr_rewarmup_after_reset(model_dir):
    trainer = _trainer(model_dir, lr=1e-2)
    _train_steps(trainer, 2)
    cb = _callback(trainer, {"kind": "keep", "rewarmup_steps": 4})
    opt = unwrap(trainer.optimizer, "optimizer")
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2)
    cb.rl_step_end(2, kl=0.0)  # reset at the end of RL step 2 (one optimizer step per RL step here)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        _train_steps(trainer, 1)
    assert seen == pytest.approx([1e-2 * k / 4 for k in (1, 2, 3, 4)] + [1e-2])


def test_no_reference_is_refused_when_resets_are_asked_for(model_dir):
    trainer = _trainer(model_dir, beta=0.0)
    assert trainer.ref_model is None  # B: TRL loads no reference at beta = 0
    with pytest.raises(ValueError, match="beta=0"):
        ReferenceResetCallback(reset={"kind": "periodic", "every": 1}, trainer=trainer)


def test_reset_source_best_is_refused_by_the_callback():
    # refused before the trainer is read: the callback keeps no snapshot of the best held-out policy
    with pytest.raises(ValueError, match="reset.source=best is not supported"):
        ReferenceResetCallback(reset={"kind": "periodic", "every": 1, "source": "best"})


def _logps(trainer, model) -> torch.Tensor:
    """Per-token log-probs of IDS's last 4 tokens as TRL computes them for its KL term."""
    with torch.no_grad():
        return trainer._get_per_token_logps_and_entropies(model, IDS, torch.ones_like(IDS), 4)[0]


def test_engine_reference_starts_as_the_given_policy_not_the_directory(model_dir):
    """TRL loads ref_model from the model's directory; the engine hands TRL a policy changed in memory
    (the bench's warm-up), so it copies that policy into the reference before training."""
    from prorl_bench.engines.trl.run import align_reference

    trainer = _trainer(model_dir)
    with torch.no_grad():  # the in-memory policy differs from the directory's weights (as after a warm-up)
        for p in trainer.model.parameters():
            p.mul_(1.5)
    assert not torch.equal(_logps(trainer, trainer.model), _logps(trainer, trainer.ref_model))
    align_reference(trainer)
    assert torch.equal(_logps(trainer, trainer.model), _logps(trainer, trainer.ref_model))


# --------------------------------------------------------------------------- the callback in a plain TRL script
#
# A stock trl.GRPOTrainer that generates, with ReferenceResetCallback in callbacks=[...] as a TRL user writes it:
# 2 prompts x 4 samples per generation batch, 2 optimizer steps per RL step (steps_per_generation=2), a reward
# with spread (the completion's ids summed mod 5), lr high enough that the KL moves every step.

PER = 2  # optimizer steps per RL step


class _Record:
    """A TrainerCallback recording TRL's training logs (global step, kl, reward) and what the reset
    callback's trigger was fed (RL step, kl) — the trigger's own input, wrapped, not re-derived."""

    def __init__(self, cb):
        from transformers import TrainerCallback

        self.logs, self.fed = [], []
        feed = cb.schedule.observe_step
        cb.schedule.observe_step = lambda step, kl: (self.fed.append((step, kl)), feed(step, kl))[1]
        rec = self

        class OnLog(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "loss" in logs:
                    rec.logs.append({"step": state.global_step, **logs})

        self.callback = OnLog()


def _script(model_dir, out, cb, *, logging_steps=1, rl_steps=8, lora=False, save_steps=None, resume=None,
            **config):  # fmt: skip
    """Train a stock GRPOTrainer with ``cb`` in its callbacks; returns the log record."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=str(out), beta=0.05, max_steps=rl_steps * PER, per_device_train_batch_size=4,
        steps_per_generation=PER, num_generations=4, max_completion_length=6, use_cpu=True, report_to="none",
        learning_rate=3e-2, lr_scheduler_type="constant", optim="adamw_torch", bf16=False, disable_tqdm=True,
        logging_steps=logging_steps, seed=0, save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500, use_bias_correction_kl=False, **config,
    )  # fmt: skip
    peft = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if lora else None
    rec = _Record(cb)
    prompts = Dataset.from_list([{"prompt": f"[BOS]R{i}{i + 3}="} for i in range(64)])
    trainer = GRPOTrainer(model=str(model_dir), args=args, peft_config=peft, callbacks=[cb, rec.callback],
                          reward_funcs=lambda completion_ids, **_: [float(sum(ids) % 5) for ids in completion_ids],
                          train_dataset=prompts)  # fmt: skip
    trainer.train(resume_from_checkpoint=resume)
    rec.trainer = trainer
    return rec


def _rl_means(logs, key):
    """TRL's per-optimizer-step values (logging_steps=1) averaged per RL step: {rl_step: mean}."""
    out = {}
    for r in logs:
        if r.get(key) is not None:
            out.setdefault((r["step"] - 1) // PER + 1, []).append(r[key])
    return {s: sum(v) / len(v) for s, v in out.items()}


KL_THRESHOLD = 0.03


@pytest.fixture(scope="module")
def kl_spike_reference(model_dir, tmp_path_factory):
    """logging_steps=1: every optimizer step's KL is in TRL's logs, so where the threshold is crossed is
    known independently of the callback."""
    cb = ReferenceResetCallback(reset={"kind": "kl_spike", "kl_threshold": KL_THRESHOLD})
    rec = _script(model_dir, tmp_path_factory.mktemp("kl1"), cb, logging_steps=1)
    return cb, rec


def test_kl_spike_resets_where_trls_kl_crosses_the_threshold(kl_spike_reference):
    cb, rec = kl_spike_reference
    kl = _rl_means(rec.logs, "kl")
    assert sorted(kl) == list(range(1, 9))  # every RL step's KL is logged
    crossed = [s for s, v in kl.items() if v > KL_THRESHOLD]
    assert 0 < len(crossed) < len(kl)  # the threshold matters: some steps cross, some do not
    assert [r["step"] for r in cb.resets] == crossed
    assert rec.fed == [(s, pytest.approx(kl[s], rel=1e-12)) for s in sorted(kl)]  # the trigger saw each step's KL
    after = [r for r in rec.logs if (r["step"] - 1) % PER == 0 and (r["step"] - 1) // PER in crossed]
    assert after and all(r["kl"] == 0.0 for r in after)  # TRL's KL right after each reset: the reference is the policy


@pytest.mark.parametrize("logging_steps", [2, 10])
def test_kl_spike_sees_every_rl_step_whatever_trl_logs(model_dir, tmp_path, kl_spike_reference, logging_steps):
    """logging_steps=2 (one log per RL step) and 10 (fewer logs than RL steps): the callback asks for a log at
    each RL-step end, so the trigger is fed the same KL and resets at the same steps as with logging_steps=1."""
    ref_cb, ref_rec = kl_spike_reference
    cb = ReferenceResetCallback(reset={"kind": "kl_spike", "kl_threshold": KL_THRESHOLD})
    rec = _script(model_dir, tmp_path, cb, logging_steps=logging_steps)
    assert [s for s, _ in rec.fed] == list(range(1, 9))
    assert [kl for _, kl in rec.fed] == pytest.approx([kl for _, kl in ref_rec.fed], rel=1e-12)
    assert [(r["step"], r["reason"]) for r in cb.resets] == [(r["step"], r["reason"]) for r in ref_cb.resets]


@pytest.mark.parametrize("logging_steps", [1, 2, 10])
def test_stall_on_a_training_metric_whatever_trl_logs(model_dir, tmp_path, logging_steps):
    """stall with metric='reward' observes TRL's logged reward once per RL step: it resets after `patience`
    RL steps without a new best (the rule simulated here on the rewards TRL logged), at any logging_steps."""
    patience = 2
    cb = ReferenceResetCallback(reset={"kind": "stall", "metric": "reward", "patience": patience})
    seen = []
    observe = cb.schedule.observe_validation
    cb.schedule.observe_validation = lambda v: (seen.append(v), observe(v))[1]
    rec = _script(model_dir, tmp_path, cb, logging_steps=logging_steps)
    assert len(seen) == 8
    if logging_steps == 1:  # TRL logs the generation batch's reward once, at the RL step's first optimizer step
        assert seen == pytest.approx(list(_rl_means(rec.logs, "reward").values()), rel=1e-12)
    best, stale, expected = None, 0, []
    for step, value in enumerate(seen, start=1):
        if best is None or value > best:
            best, stale = value, 0
            continue
        stale += 1
        if stale >= patience:
            expected.append(step)
            best, stale = None, 0
    assert expected and [r["step"] for r in cb.resets] == expected
    assert all("reward has not improved" in r["reason"] for r in cb.resets)


def test_stall_on_an_evaluation_metric(model_dir, tmp_path):
    """stall with metric='eval_reward' observes each of TRL's evaluations (here after every RL step): a reset
    comes at the end of the RL step after the evaluation that completed `patience` evaluations without a new
    best (the evaluation runs after the RL step's end, in TRL's loop)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    patience = 1
    cb = ReferenceResetCallback(reset={"kind": "stall", "metric": "eval_reward", "patience": patience})
    seen = []
    observe = cb.schedule.observe_validation
    cb.schedule.observe_validation = lambda v: (seen.append(v), observe(v))[1]
    evals = []

    class Evals(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kw):
            evals.append((state.global_step // PER, metrics["eval_reward"]))

    cb_evals = Evals()
    rec = _Record(cb)

    args = GRPOConfig(
        output_dir=str(tmp_path), beta=0.05, max_steps=6 * PER, per_device_train_batch_size=4,
        steps_per_generation=PER, num_generations=4, max_completion_length=6, use_cpu=True, report_to="none",
        learning_rate=3e-2, lr_scheduler_type="constant", optim="adamw_torch", bf16=False, disable_tqdm=True,
        logging_steps=1, seed=0, save_strategy="no", eval_strategy="steps", eval_steps=PER,
        per_device_eval_batch_size=4, use_bias_correction_kl=False,
    )  # fmt: skip
    train = Dataset.from_list([{"prompt": f"[BOS]R{i}{i + 3}="} for i in range(64)])
    held_out = Dataset.from_list([{"prompt": f"[BOS]S{i}{i + 5}="} for i in range(4)])
    trainer = GRPOTrainer(model=str(model_dir), args=args, callbacks=[cb, rec.callback, cb_evals],
                          reward_funcs=lambda completion_ids, **_: [float(sum(ids) % 5) for ids in completion_ids],
                          train_dataset=train, eval_dataset=held_out)  # fmt: skip
    trainer.train()
    assert [s for s, _ in evals] == list(range(1, 7)) and seen == [v for _, v in evals]
    best, stale, expected = None, 0, []
    for step, value in evals:
        if best is None or value > best:
            best, stale = value, 0
            continue
        stale += 1
        if stale >= patience:
            expected.append(step + 1)  # decided at the next RL step's end
            best, stale = None, 0
    expected = [s for s in expected if s <= 6]
    assert expected and [r["step"] for r in cb.resets] == expected
    assert all("eval_reward has not improved" in r["reason"] for r in cb.resets)


def test_in_callbacks_list_full_and_lora_reference_is_the_policy_after_a_reset(model_dir, tmp_path):
    """GRPOTrainer(..., callbacks=[ReferenceResetCallback("periodic" every RL step)]): bound at on_train_begin
    (a full model's ref_model found from the running trainer); after training (a reset at the last RL step) the
    reference TRL uses computes the policy's log-probs exactly."""
    from trl.trainer.utils import use_adapter

    for lora in (False, True):
        cb = ReferenceResetCallback(reset={"kind": "periodic", "every": 1}, opt_reset="hard")
        trainer = _script(model_dir, tmp_path / str(lora), cb, rl_steps=2, lora=lora).trainer
        assert [r["step"] for r in cb.resets] == [1, 2]
        model = trainer.model
        if lora:
            with use_adapter(model, REFERENCE_ADAPTER):
                ref = _logps(trainer, model)
            assert trainer.ref_model is None and cb.ref_model is None
        else:
            assert cb.ref_model is trainer.ref_model
            ref = _logps(trainer, trainer.ref_model)
        assert torch.equal(ref, _logps(trainer, model))


# --------------------------------------------------------------------------- alpha-mix under LoRA


def _lora_policy(model_dir, r=8):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir))
    targets = ["q_proj", "v_proj", "up_proj", "down_proj"]  # square, wide and tall weights
    return get_peft_model(base, LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, lora_dropout=0.0))


def _move_adapter(model, gen):
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".default." in n:
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)


def _delta(layer, name):
    return (layer.lora_B[name].weight @ layer.lora_A[name].weight).double() * layer.scaling[name]


def test_polyak_under_lora_mixes_the_merged_weights(model_dir):
    """After each alpha-mix the reference adapter's logits equal those of a plain model whose adapted weights are
    W0 + D, with D <- (1 - alpha) D + alpha * dW_policy tracked here from merged weights (float64); through the
    rank cap (hidden 32, r 8: ranks 8, 16, 24, then full) and for square, wide and tall weights."""
    from peft.tuners.lora import LoraLayer
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import use_adapter

    from prorl_bench.engines.trl.peft_reference import reset_peft_reference

    alpha, gen = 0.6, torch.Generator().manual_seed(0)
    model = _lora_policy(model_dir)
    model.eval()
    layers = {n.removeprefix("base_model.model."): m for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    mixed = {n: torch.zeros_like(m.get_base_layer().weight, dtype=torch.float64) for n, m in layers.items()}
    ranks = []
    for _ in range(5):
        _move_adapter(model, gen)
        for n, m in layers.items():
            mixed[n] = (1 - alpha) * mixed[n] + alpha * _delta(m, "default")
        policy_before = _logits(model)
        ranks.append(reset_peft_reference(model, alpha)["ref_rank"])
        assert torch.equal(_logits(model), policy_before)  # the policy is untouched
        assert model.active_adapter == "default"
        merged = AutoModelForCausalLM.from_pretrained(str(model_dir))  # W0, then W0 + D where LoRA adapts
        with torch.no_grad():
            for n, m in layers.items():
                merged.get_submodule(n).weight.copy_((m.get_base_layer().weight.double() + mixed[n]).float())
        with use_adapter(model, REFERENCE_ADAPTER):
            ref = _logits(model)
        want = _logits(merged)
        assert torch.allclose(ref, want, atol=1e-5, rtol=0), (ref - want).abs().max()
        assert not torch.allclose(ref, policy_before, atol=1e-3)  # a mix, not a copy
    assert ranks == [8, 16, 24, 32, 32]
    assert not any(p.requires_grad for n, p in model.named_parameters() if f".{REFERENCE_ADAPTER}." in n)


def test_polyak_under_lora_is_independent_of_the_rng(model_dir):
    """The same mixes under different global RNG states give the same reference bitwise, and leave the RNG
    state as it was (PEFT's random init of a new adapter runs under a forked RNG and is overwritten)."""
    from trl.trainer.utils import use_adapter

    from prorl_bench.engines.trl.peft_reference import reset_peft_reference

    refs = []
    for seed in (0, 1):
        torch.manual_seed(123)  # the same policy (PEFT draws its A from the global RNG)
        model, gen = _lora_policy(model_dir), torch.Generator().manual_seed(7)
        model.eval()
        torch.manual_seed(seed)  # then a different RNG state at the resets
        for _ in range(2):
            _move_adapter(model, gen)
            state = torch.get_rng_state()
            reset_peft_reference(model, 0.6)
            assert torch.equal(torch.get_rng_state(), state)
        with use_adapter(model, REFERENCE_ADAPTER):
            refs.append(_logits(model))
    assert torch.equal(refs[0], refs[1])


# --------------------------------------------------------------------------- resume


@pytest.mark.parametrize(
    "lora,reset,opt_reset",
    [
        (False, {"kind": "periodic", "every": 2}, {"kind": "keep", "rewarmup_steps": 2}),
        (False, {"kind": "kl_spike", "kl_threshold": KL_THRESHOLD, "min_spacing": 2}, "hard"),
        (True, {"kind": "polyak", "every": 2}, {"kind": "soft", "factor": 0.5, "step": "reset"}),
    ],
    ids=["full-periodic-rewarmup", "full-kl_spike-spacing", "lora-polyak"],
)
def test_resume_continues_as_the_uninterrupted_run(model_dir, tmp_path, lora, reset, opt_reset):
    """8 RL steps straight, against 4 + a resume from TRL's checkpoint-8 (optimizer step 8 = RL step 4) by a
    fresh trainer and callback: TRL's logged KL of every step after the resume, the resets (steps, reasons,
    optimizer and LR records), the trigger state and the learning rate are the uninterrupted run's. A reset
    precedes the checkpoint, so a lost reference would show in the first KL after it."""
    kw = {"lora": lora, "save_steps": 4 * PER, "logging_steps": 1}
    straight = ReferenceResetCallback(reset=reset, opt_reset=opt_reset)
    rec_a = _script(model_dir, tmp_path / "a", straight, **kw)
    _script(model_dir, tmp_path / "b", ReferenceResetCallback(reset=reset, opt_reset=opt_reset), rl_steps=4, **kw)
    ckpt = tmp_path / "b" / f"checkpoint-{4 * PER}"
    assert (ckpt / "reference_reset_state.pt").is_file()
    resumed = ReferenceResetCallback(reset=reset, opt_reset=opt_reset)
    rec_b = _script(model_dir, tmp_path / "b", resumed, resume=str(ckpt), **kw)
    after = [r for r in rec_a.logs if r["step"] > 4 * PER]
    assert any(r["step"] <= 4 for r in straight.resets)  # a reset before the checkpoint
    assert any(r["step"] > 4 for r in straight.resets)  # and one after it
    keys = ("step", "kl", "loss", "learning_rate", "reward")
    assert [[r.get(k) for k in keys] for r in rec_b.logs] == [[r.get(k) for k in keys] for r in after]
    assert resumed.resets == straight.resets
    assert resumed.schedule.state_dict() == straight.schedule.state_dict()


# --------------------------------------------------------------------------- a TRL user's frictions


def test_one_vocabulary_for_both_dicts_and_string_shorthands():
    from prorl_bench.config import StepPolicy

    cb = ReferenceResetCallback("periodic", "hard")
    assert (cb.reset_cfg.trigger, cb.reset_cfg.params.every) == ("periodic", 50)
    assert (cb.opt_cfg.kind, cb.opt_cfg.step) == ("hard", StepPolicy.reset)  # hard fixes step=reset
    cb = ReferenceResetCallback({"kind": "kl_spike", "kl_threshold": 0.1}, {"kind": "soft", "factor": 0.2})
    assert (cb.reset_cfg.trigger, cb.opt_cfg.kind, cb.opt_cfg.params.factor) == ("kl_spike", "soft", 0.2)
    for bad, hint in [
        (dict(reset={"trigger": "periodic"}), "did you mean 'kind'"),  # the old reset key
        (dict(opt_reset={"trigger": "hard"}), "did you mean 'kind'"),
        (dict(reset={"kind": "periodc"}), "did you mean 'periodic'"),
        (dict(opt_reset="medium"), "unknown kind 'medium'"),
        (dict(reset={"kind": "periodic", "evry": 5}), "did you mean reset.every"),
        (dict(reset={"kind": "periodic", "step": "reset"}), "put it in opt_reset"),
        (dict(opt_reset={"kind": "hard", "every": 5}), "put it in reset"),
        (dict(opt_reset={"kind": "soft", "step": "sometimes"}), "'keep' or 'reset'"),
        (dict(reset={"every": 5}), "name the option with 'kind'"),
    ]:
        with pytest.raises(ValueError, match=hint):
            ReferenceResetCallback(**bad)


def test_no_reset_unless_asked_and_the_old_signature_is_explained(model_dir):
    assert ReferenceResetCallback().reset_cfg.trigger == "none"
    trainer = _trainer(model_dir)
    with pytest.raises(TypeError, match="callbacks=\\[ReferenceResetCallback"):
        ReferenceResetCallback(trainer, {"kind": "periodic"})
    with pytest.raises(TypeError, match="reset key"):
        ReferenceResetCallback({"kind": "stall", "metric": "reward"}, metric="reward")


def test_stall_needs_a_metric():
    with pytest.raises(ValueError, match="stall trigger needs 'metric'"):
        ReferenceResetCallback({"kind": "stall", "patience": 2})
    with pytest.raises(ValueError, match="stall trigger only"):
        ReferenceResetCallback({"kind": "periodic", "metric": "reward"})
    cb = ReferenceResetCallback({"kind": "stall", "metric": "eval_reward"})
    assert (cb.metric_from, cb.needs_logs) == ("eval", False)
    assert ReferenceResetCallback({"kind": "stall", "metric": "reward"}).needs_logs


def test_frequent_soft_resets_warn_in_scripts_as_on_the_cli():
    from prorl_bench.rl.resets import StepCounterHazardWarning

    with pytest.warns(StepCounterHazardWarning, match="ratchets up"):
        ReferenceResetCallback({"kind": "periodic", "every": 10}, "soft")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ReferenceResetCallback({"kind": "periodic", "every": 10}, {"kind": "soft", "step": "reset"})
        ReferenceResetCallback({"kind": "periodic", "every": 100}, "soft")


def test_trl_version_outside_the_tested_range(monkeypatch):
    import trl

    from prorl_bench.engines.trl.callback import TRLVersionWarning
    from prorl_bench.engines.trl.config_map import trl_version_problem

    assert trl_version_problem() is None  # the installed TRL is the tested one
    assert "tested on TRL 1.16.0 only" in trl_version_problem("1.17.0")
    assert trl_version_problem("1.15.2") is not None
    monkeypatch.setattr(trl, "__version__", "2.0.0")
    with pytest.warns(TRLVersionWarning, match="TRL 2.0.0 is installed"):
        ReferenceResetCallback()


def test_engine_refuses_an_untested_trl(monkeypatch, tmp_path):
    import trl

    from prorl_bench.config import ConfigError, to_config
    from prorl_bench.engines.trl.config_map import refuse_for_trl
    from prorl_bench.models.tiny_hf import build_tiny_llama
    from tests.conftest import compose_cfg

    path = build_tiny_llama(tmp_path / "m", hidden_size=32, n_layers=1, n_heads=4)
    cfg = to_config(compose_cfg(["engine=trl", "model=hf_causal_lm", f"model.path={path}"]))
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(ConfigError, match="engine=trl: TRL 1.17.0 is installed"):
        refuse_for_trl(cfg)


def test_trl_warmup_is_what_a_hard_reset_restarts_and_both_warmups_are_refused(model_dir):
    """GRPOConfig(warmup_steps=2) warms up once at the start (TRL's schedule); a hard reset restarts a warm-up of
    the same length (RL steps) through the callback's factor; the callback's own lr_warmup_steps on top of TRL's
    would multiply the two: refused."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def trainer_with_warmup():
        args = GRPOConfig(
            output_dir=str(model_dir.parent / "warm"), beta=0.01, max_steps=8, per_device_train_batch_size=4,
            num_generations=4, steps_per_generation=1, max_completion_length=4, use_cpu=True, report_to="none",
            learning_rate=1e-2, lr_scheduler_type="constant_with_warmup", warmup_steps=2, optim="adamw_torch",
            bf16=False, disable_tqdm=True,
        )  # fmt: skip
        t = GRPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                        args=args, train_dataset=Dataset.from_list([{"prompt": "[BOS]R12="}] * 8))  # fmt: skip
        t.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
        return t

    trainer = trainer_with_warmup()
    cb = ReferenceResetCallback({"kind": "periodic", "every": 1}, "hard", trainer=trainer)
    cb.on_train_begin(trainer.args, trainer.state, trainer.control, model=trainer.model,
                      optimizer=trainer.optimizer, lr_scheduler=trainer.lr_scheduler)  # fmt: skip
    opt = unwrap(trainer.optimizer, "optimizer")
    seen = []
    for _ in range(3):
        seen.append(opt.param_groups[0]["lr"])
        _train_steps(trainer, 1)
    cb.rl_step_end(3, kl=0.0)
    for _ in range(3):
        seen.append(opt.param_groups[0]["lr"])
        _train_steps(trainer, 1)
    assert seen == pytest.approx([0.0, 5e-3, 1e-2, 5e-3, 1e-2, 1e-2])  # TRL's ramp (step 0: lr 0), then ours

    trainer = trainer_with_warmup()
    cb = ReferenceResetCallback("periodic", lr_warmup_steps=3, trainer=trainer)
    with pytest.raises(ValueError, match="would multiply"):
        cb.on_train_begin(trainer.args, trainer.state, trainer.control, model=trainer.model,
                          optimizer=trainer.optimizer, lr_scheduler=trainer.lr_scheduler)  # fmt: skip


def test_resuming_without_the_callbacks_state_fails_loudly(model_dir, tmp_path):
    from transformers import TrainerState

    trainer = _trainer(model_dir)
    cb = ReferenceResetCallback("periodic", trainer=trainer)
    state = TrainerState(global_step=6, max_steps=8)
    with pytest.raises(FileNotFoundError, match="resume_from"):
        cb.on_train_begin(trainer.args, state, trainer.control, model=trainer.model, optimizer=trainer.optimizer,
                          lr_scheduler=trainer.lr_scheduler)  # fmt: skip
    cb.resume_from(False)  # a checkpoint saved without the callback: start it fresh, knowingly
    cb.on_train_begin(trainer.args, state, trainer.control, model=trainer.model, optimizer=trainer.optimizer,
                      lr_scheduler=trainer.lr_scheduler)  # fmt: skip


def test_no_private_trl_attribute_is_read_by_the_callback():
    """callback.py and peft_reference.py read no ``_``-prefixed attribute of any object but their own
    (``self._x``): TRL's, transformers' and PEFT's private state is out of reach (the issue's ``_metrics``)."""
    import ast
    from pathlib import Path

    import prorl_bench.engines.trl.callback as callback_module

    for name in ("callback.py", "peft_reference.py"):
        tree = ast.parse((Path(callback_module.__file__).parent / name).read_text())
        private = [
            f"{name}:{node.lineno}: .{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ]
        assert private == []

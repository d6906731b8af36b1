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
    cb = ReferenceResetCallback(trainer, reset={"trigger": "periodic", "every": 1, **reset}, opt_reset=opt_reset)
    cb.on_train_begin(trainer.args, trainer.state, trainer.control, lr_scheduler=trainer.lr_scheduler)
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
    with pytest.raises(ValueError, match="needs a reference model"):
        ReferenceResetCallback(trainer, reset={"trigger": "periodic", "every": 1})


def test_reset_source_best_is_refused_by_the_callback():
    # refused before the trainer is read: the callback keeps no snapshot of the best held-out policy
    with pytest.raises(ValueError, match="reset.source=best is not supported"):
        ReferenceResetCallback(None, reset={"trigger": "periodic", "every": 1, "source": "best"})


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

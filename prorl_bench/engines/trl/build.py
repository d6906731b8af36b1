"""What TRL's ``GRPOTrainer`` is built from, translated from the bench's config (config_map.py names
every field): the ``GRPOConfig``, the prompt dataset in the bench's order, the bench's verifier as the
reward function, and the PEFT adapter config.

One bench RL step = one TRL generation batch = ``minibatches x ppo_epochs`` optimizer steps
(``gradient_accumulation_steps=1``): ``optimizer_steps_per_rl_step``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prorl_bench.config import AdamWImpl, AdapterKind, Config, ConfigError, Device, DType
from prorl_bench.engines.trl.config_map import LOSS_TYPES, SCALE_REWARDS, ref_source
from prorl_bench.run.evaluation import score_details
from prorl_bench.tasks.base import Problem, Task


def optimizer_steps_per_rl_step(cfg: Config) -> int:
    """Optimizer steps TRL takes per generation batch (= per bench RL step)."""
    return cfg.algo.minibatches * cfg.algo.ppo_epochs


def grpo_args(cfg: Config, output_dir: Path, completion_budget: int, processes: int = 1) -> Any:
    """``GRPOConfig`` for ``cfg``. ``completion_budget``: tokens (the task's, or algo.max_new_tokens);
    ``processes``: data-parallel processes (accelerate), which split each minibatch."""
    from trl import GRPOConfig

    a = cfg.algo
    batch = a.prompts_per_step * a.group_size
    if batch % (a.minibatches * processes):
        raise ConfigError(
            f"invalid config value algo.minibatches={a.minibatches}: prompts_per_step x group_size ({batch}) must "
            f"split into minibatches x processes ({a.minibatches} x {processes}) equal parts under engine=trl"
        )
    per_gen = optimizer_steps_per_rl_step(cfg)
    cuda = cfg.hardware.device != Device.cpu
    every = cfg.checkpoint.every
    return GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=not cuda,
        bf16=cuda and cfg.hardware.dtype == DType.bf16,
        tf32=cfg.hardware.tf32 if cuda else None,
        gradient_checkpointing=cfg.engine.params.gradient_checkpointing,
        per_device_train_batch_size=batch // (a.minibatches * processes),
        steps_per_generation=a.minibatches,
        gradient_accumulation_steps=1,
        num_generations=a.group_size,
        num_iterations=a.ppo_epochs,
        max_completion_length=completion_budget,
        temperature=a.temperature,
        top_p=a.top_p,
        top_k=a.top_k,
        beta=0.0 if ref_source(cfg) == "old" else a.beta,  # B: no reference model; the trainer anchors at pi_old
        # k3 itself, or k3 x pi_theta/pi_old with kl_estimator.importance_weight=true (TRL 1.16's default is True)
        use_bias_correction_kl=bool(getattr(cfg.kl_estimator.params, "importance_weight", False)),
        epsilon=a.eps_low,
        epsilon_high=a.eps_high,
        loss_type=LOSS_TYPES[a.loss_agg],
        scale_rewards=SCALE_REWARDS[a.advantage],
        entropy_coef=a.entropy_coef,
        learning_rate=a.lr,
        lr_scheduler_type="constant",  # the bench's warm-up / re-warm-up multiply into it (callback.py)
        warmup_steps=0,
        weight_decay=a.weight_decay,
        adam_beta1=a.adam_beta1,
        adam_beta2=a.adam_beta2,
        adam_epsilon=a.adam_eps,
        optim="adamw_torch_fused" if a.adamw_impl == AdamWImpl.fused else "adamw_torch",
        max_grad_norm=a.grad_clip,
        max_steps=cfg.steps * per_gen,
        logging_steps=per_gen,  # one TRL log per RL step: its averages are the step's metrics
        save_strategy="steps" if every else "no",
        save_steps=every * per_gen if every else 500,
        save_total_limit=cfg.checkpoint.keep_last,
        save_only_model=False,  # optimizer, scheduler, RNG: a resume continues the same run
        shuffle_dataset=False,  # the dataset is already in the bench's prompt order
        disable_dropout=cfg.model.dropout == 0.0,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
        mask_truncated_completions=False,
        seed=cfg.seed,
        data_seed=cfg.seed,
    )


def trl_prompt(tok: Any, text: str) -> str | list[dict[str, str]]:
    """The dataset's ``prompt`` for one problem such that TRL tokenizes it to exactly the ids the bench
    feeds its own policy (BOS + text, or the chat template's turn): checked, or a ConfigError."""
    if tok.chat:
        return [{"role": "user", "content": text}]
    want = tok.encode_prompts([text])[0][0].tolist()
    for candidate in (text, (tok.hf.bos_token or "") + text):
        if tok.hf(text=candidate)["input_ids"] == want:
            return candidate
    raise ConfigError(
        f"model.path: TRL would tokenize the prompt {text!r} differently from the bench ({want}); "
        "engine=trl needs a tokenizer whose prompt ids can be reproduced from text"
    )


def prompt_dataset(cfg: Config, task: Task, tok: Any) -> tuple[Any, list[Problem]]:
    """Every RL step's prompts, in the order the native trainer draws them for this seed (one
    ``task.sample_train(rng, prompts_per_step)`` per step), as a ``datasets.Dataset`` with columns
    ``prompt`` and ``idx`` (the problem's index, which the reward function looks up)."""
    from datasets import Dataset

    rng = random.Random(cfg.seed)
    problems = [p for _ in range(cfg.steps) for p in task.sample_train(rng, cfg.algo.prompts_per_step)]
    cache: dict[str, Any] = {}
    rows = []
    for i, p in enumerate(problems):
        if p.prompt not in cache:
            cache[p.prompt] = trl_prompt(tok, p.prompt)
        rows.append({"prompt": cache[p.prompt], "idx": i})
    return Dataset.from_list(rows), problems


@dataclass
class RewardLog:
    """What the reward function saw since the last RL step: rewards, successes, completion lengths."""

    rewards: list[float] = field(default_factory=list)
    success: list[bool] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)

    def take(self) -> tuple[list[float], list[bool], list[int]]:
        out = (self.rewards, self.success, self.lengths)
        self.rewards, self.success, self.lengths = [], [], []
        return out


def bench_reward(task: Task, tok: Any, problems: list[Problem], log: RewardLog) -> Callable[..., list[float]]:
    """TRL reward function: the bench's verifier on the completion ids decoded the bench's way (up to
    EOS, special tokens dropped), looked up by the dataset's ``idx`` column."""

    def reward(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], idx: list[int],
               **_: Any) -> list[float]:  # fmt: skip
        texts = [tok.decode(ids) for ids in completion_ids]
        rewards, success, _details = score_details(task, texts, [problems[i] for i in idx])
        log.rewards += rewards
        log.success += success
        log.lengths += [len(ids) for ids in completion_ids]
        return rewards

    reward.__name__ = f"bench_{task.name}"
    return reward


def peft_config(cfg: Config) -> Any:
    """PEFT ``LoraConfig`` for adapter=lora (None without adapters)."""
    if cfg.adapter.kind != AdapterKind.lora:
        return None
    d = cfg.adapter.params
    from peft import LoraConfig

    return LoraConfig(r=d.rank, lora_alpha=d.alpha, target_modules=list(d.targets), lora_dropout=0.0,
                      task_type="CAUSAL_LM")  # fmt: skip

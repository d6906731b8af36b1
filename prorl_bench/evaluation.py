"""Held-out evaluation: greedy and sampled success, mean reward, and a degeneracy signal."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prorl_bench.rollout import Rollout, generate
from prorl_bench.tasks import CharTokenizer, Problem, Task


def completions(tok: CharTokenizer, batch: Rollout) -> list[str]:
    return [tok.decode(row) for row in batch.completion_ids.tolist()]


def score(task: Task, texts: Sequence[str], problems: Sequence[Problem]) -> tuple[list[float], list[bool]]:
    scored = [task.score(c, p) for c, p in zip(texts, problems)]
    return [r for r, _ in scored], [s for _, s in scored]


@torch.no_grad()
def evaluate(
    policy: torch.nn.Module,
    task: Task,
    tok: CharTokenizer,
    problems: Sequence[Problem],
    temperature: float,
    generator: torch.Generator,
    device: torch.device,
    greedy_too: bool = True,
) -> dict[str, float]:
    """Validation figures on ``problems``.

    ``val/unique_frac`` is the fraction of distinct sampled completions: near 0 means the policy
    collapsed to a few outputs (a degeneracy signal independent of correctness).
    """
    was_training = policy.training
    policy.eval()
    ids, mask = tok.encode_prompts([p.prompt for p in problems])
    ids, mask = ids.to(device), mask.to(device)
    out: dict[str, float] = {}
    sampled = completions(
        tok, generate(policy, tok, ids, mask, task.max_completion_len, temperature, generator=generator)
    )
    rewards, success = score(task, sampled, problems)
    out["val/success_sampled"] = sum(success) / len(success)
    out["val/reward_mean"] = sum(rewards) / len(rewards)
    out["val/unique_frac"] = len(set(sampled)) / len(sampled)
    if greedy_too:
        greedy = completions(tok, generate(policy, tok, ids, mask, task.max_completion_len, 1.0, greedy=True))
        out["val/success_greedy"] = sum(score(task, greedy, problems)[1]) / len(problems)
    policy.train(was_training)
    return out

"""Held-out evaluation: what RL does to the policy's *distribution*, not only its best guess.

``validate`` draws ``n`` samples per held-out prompt (one batched generate call, chunked) and reports

* ``val/pass@{k}``: unbiased pass@k (``passk.py``), per prompt then averaged — coverage. RL often
  raises pass@1 while *lowering* pass@n (the policy narrows onto fewer answers);
* ``val/success_sampled`` (= pass@1: the mean success over all samples) and ``val/reward_mean``;
* ``val/distinct_per_prompt``: distinct completions among one prompt's n samples, averaged — the
  collapse signal (n = fully diverse, 1 = one answer per prompt);
* ``val/unique_frac``: distinct completions across *different* prompts (first sample of each) over
  the number of prompts — a degeneracy signal only (a policy that answers each prompt with its own
  single answer scores 1 here while ``distinct_per_prompt`` is 1);
* ``val/entropy``: mean per-token entropy (nats) of the sampling distribution along the samples;
* ``val/success_greedy``: greedy decoding;
* ``val/by_difficulty/<label>/success`` and ``.../pass@{k_max}``: the same per difficulty label the
  task gives each problem (input length for the digit tasks, the generator for reasoning-gym).
* ``val/coverage@{k_max}/both``, ``.../base_only`` (shrinkage), ``.../trained_only`` (expansion),
  ``.../neither``: the per-prompt classes of "The Invisible Leash" against the base evaluation
  (``passk.coverage_classes``: expected fractions of prompts, summing to 1), at k = max(``ks``); only
  when the base's per-prompt correct counts are given (every evaluation after a step-0 base one).

and returns the ``samples.jsonl`` rows (prompt, target, difficulty, every sample with its reward and
success, the greedy completion) so a person can read what changed. How many prompts: ``prompts_to_write``
— every held-out prompt at the base evaluation (step 0) and at the final step, so pass@k, success and
the per-difficulty figures of those rows can be recomputed from ``samples.jsonl`` alone (tested to
1e-9); the first ``eval.n_sample_prompts`` in between (the file stays small on long runs).

The base evaluation is *per run*: the base weights are the same in every run of a sweep (the warm-up
is seeded by ``warmup.seed``), but its samples are drawn with the run's own generator (seed
``run seed * 1_000_003 + step``), so the base's pass@k differs between seeds by sampling noise alone
(pass@16 0.633-0.742 over seeds 8-15 on 128 prompts). Compare a run with its own base, or average bases.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from prorl_bench.models.rollout import Rollout, generate, token_logprobs
from prorl_bench.models.tokenizers import CharTokenizer
from prorl_bench.run.passk import coverage_classes, distinct_per_prompt, mean_pass_at_k
from prorl_bench.tasks.base import Problem, Task


def prompts_to_write(step: int, final_step: int, n_prompts: int, n_sample_prompts: int) -> int:
    """How many held-out prompts ``samples.jsonl`` keeps at ``step``: all of them at the base (step 0)
    and at the final step (pass@k auditable from the file), ``n_sample_prompts`` otherwise."""
    return n_prompts if step in (0, final_step) else min(n_sample_prompts, n_prompts)


def correct_counts(samples: Sequence[dict[str, Any]]) -> list[int]:
    """Correct samples per prompt of ``validate``'s sample rows (all prompts at the base evaluation):
    what a later evaluation needs to place each prompt in its coverage class."""
    return [sum(bool(x["success"]) for x in row["samples"]) for row in samples]


def completions(tok: CharTokenizer, batch: Rollout) -> list[str]:
    return [tok.decode(row) for row in batch.completion_ids.tolist()]


def score(task: Task, texts: Sequence[str], problems: Sequence[Problem]) -> tuple[list[float], list[bool]]:
    rewards, success, _ = score_details(task, texts, problems)
    return rewards, success


def score_details(
    task: Task, texts: Sequence[str], problems: Sequence[Problem]
) -> tuple[list[float], list[bool], list[dict[str, Any]]]:
    """Rewards, successes and per-sample details. A task that scores a whole batch at once (the code
    task runs its programs in parallel sandboxes) provides ``score_many``; others score one by one."""
    if hasattr(task, "score_many"):
        return task.score_many(texts, problems)
    scored = [task.score(c, p) for c, p in zip(texts, problems)]
    return [r for r, _ in scored], [s for _, s in scored], [{} for _ in scored]


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
    """One sample per problem (and greedy): the warm-up's stopping check (``base.py``).

    Kept separate from ``validate`` so the cached base policies stay exactly what they were.
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


@torch.no_grad()
def validate(
    policy: torch.nn.Module,
    task: Task,
    tok: CharTokenizer,
    problems: Sequence[Problem],
    *,
    temperature: float,
    banned: tuple[int, ...],
    generator: torch.Generator,
    device: torch.device,
    n_samples: int,
    ks: Sequence[int],
    n_sample_prompts: int,
    chunk: int,
    on_progress: Callable[[int, int], None] | None = None,
    base_correct: Sequence[int] | None = None,
    sample: Callable[..., Rollout] = generate,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Validation row (keys above) and the readable sample rows. ``chunk``: sequences per generate call.
    ``on_progress(done, total)``: called after each generate call, in sequences generated (the
    samples, then one greedy sequence per prompt). ``base_correct``: the base evaluation's correct
    samples per prompt (``correct_counts``, same prompts, ``n_samples`` each): adds the coverage classes.
    ``sample``: the sampler (``rollout.generate``'s signature; a run passes its ``RunContext.sample``)."""
    was_training = policy.training
    policy.eval()
    n = n_samples
    flat = [p for p in problems for _ in range(n)]  # prompt-major: samples of problem i at [i*n, (i+1)*n)
    total = len(flat) + len(problems)
    progress = (lambda done: on_progress(done, total)) if on_progress is not None else (lambda done: None)
    texts, entropy = _sample_texts(policy, task, tok, flat, temperature, banned, generator, device, chunk, sample,
                                   progress)  # fmt: skip
    rewards, success, details = score_details(task, texts, flat)

    ids, mask = tok.encode_prompts([p.prompt for p in problems])
    greedy = completions(
        tok, sample(policy, tok, ids.to(device), mask.to(device), task.max_completion_len, 1.0, greedy=True)
    )
    greedy_success = score(task, greedy, problems)[1]
    policy.train(was_training)
    if on_progress is not None:
        on_progress(total, total)
    row = _row(problems, texts, rewards, success, greedy_success, entropy, n, ks, base_correct)
    samples = [
        {
            "prompt": p.prompt,
            "target": p.target,
            "difficulty": p.difficulty,
            "samples": [
                {
                    "completion": texts[i * n + j],
                    "reward": rewards[i * n + j],
                    "success": success[i * n + j],
                    **details[i * n + j],  # e.g. the code task's failure class
                }
                for j in range(n)
            ],
            "greedy": greedy[i],
            "greedy_success": greedy_success[i],
        }
        for i, p in enumerate(problems[:n_sample_prompts])
    ]
    return row, samples


def _sample_texts(policy, task, tok, flat, temperature, banned, generator, device, chunk, sample, progress):
    """Sample one completion per entry of ``flat`` in chunks; (texts, mean token entropy in nats)."""
    texts: list[str] = []
    ent_sum, ent_tokens = 0.0, 0.0
    for s in range(0, len(flat), chunk):
        part = flat[s : s + chunk]
        ids, mask = tok.encode_prompts([p.prompt for p in part])
        batch = sample(
            policy, tok, ids.to(device), mask.to(device), task.max_completion_len, temperature, generator=generator
        )
        texts += completions(tok, batch)
        _, ent = token_logprobs(policy, batch, temperature, banned, with_entropy=True)
        ent_sum += float((ent * batch.completion_mask).sum())
        ent_tokens += float(batch.completion_mask.sum())
        progress(s + len(part))
    return texts, (ent_sum / ent_tokens if ent_tokens else float("nan"))


def _row(problems, texts, rewards, success, greedy_success, entropy, n, ks, base_correct) -> dict[str, float]:
    """The validation row's keys (module docstring) from the scored samples; prompt-major, ``n`` per prompt."""
    by_prompt = [success[i * n : (i + 1) * n] for i in range(len(problems))]
    texts_by_prompt = [texts[i * n : (i + 1) * n] for i in range(len(problems))]
    row: dict[str, float] = {
        "val/success_sampled": sum(success) / len(success),
        "val/reward_mean": sum(rewards) / len(rewards),
        "val/unique_frac": len({t[0] for t in texts_by_prompt}) / len(problems),
        "val/distinct_per_prompt": distinct_per_prompt(texts_by_prompt),
        "val/entropy": entropy,
        "val/success_greedy": sum(greedy_success) / len(problems),
    }
    for k in ks:
        row[f"val/pass@{k}"] = mean_pass_at_k(by_prompt, k)
    k_max = max(ks)
    if base_correct is not None:
        counts = [sum(map(bool, b)) for b in by_prompt]
        for name, frac in coverage_classes(base_correct, n, counts, n, k_max).items():
            row[f"val/coverage@{k_max}/{name}"] = frac
    groups: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(problems):
        groups[p.difficulty or "all"].append(i)
    for label in sorted(groups):
        idx = groups[label]
        row[f"val/by_difficulty/{label}/success"] = sum(sum(by_prompt[i]) for i in idx) / (n * len(idx))
        row[f"val/by_difficulty/{label}/pass@{k_max}"] = mean_pass_at_k([by_prompt[i] for i in idx], k_max)
    return row

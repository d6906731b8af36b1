"""pass@k and per-prompt diversity: pure functions over n samples per prompt.

pass@k is the probability that at least one of k samples, drawn without replacement from the n
generated for a prompt, is correct. With c correct among n, the unbiased estimator (Chen et al.
2021, "Evaluating large language models trained on code") is

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i),

computed in the product form (no huge binomials: every factor lies in [0, 1], so k = n = 1024 is as
exact as k = 1), per prompt, then averaged over prompts.

Coverage classes ("The Invisible Leash", Wu et al. 2025, arXiv 2507.14843): per held-out prompt, is it
solved at k by the base, by the trained policy, by both, by neither? "Solved at k" is the event that
k samples (without replacement, from the n drawn) contain a correct one: its probability is the
prompt's pass@k. Base and trained samples are independent draws, so the expected fraction of prompts
in each class is the mean over prompts of pk_base * pk_trained (both), pk_base * (1 - pk_trained)
(base only: shrinkage), (1 - pk_base) * pk_trained (trained only: expansion) and the rest (neither),
each an unbiased estimate (a product of independent unbiased estimates). At k = n the classes are the
plain counts "at least one correct sample among n".
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with ``c`` correct out of ``n`` samples (0 <= c <= n, 1 <= k <= n)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(
            f"pass@{k} needs 0 <= c <= n and 1 <= k <= n samples per prompt (eval.ks must not exceed "
            f"eval.n_samples), got n={n}, c={c}, k={k}"
        )
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def coverage_classes(
    base_correct: Sequence[int], base_n: int, correct: Sequence[int], n: int, k: int
) -> dict[str, float]:
    """Expected fractions of prompts solved at ``k`` by both / the base only / the trained policy only /
    neither (module docstring). ``base_correct[p]`` and ``correct[p]``: correct samples of prompt p out of
    ``base_n`` and ``n``; the same prompts in the same order. The four fractions sum to 1."""
    if len(base_correct) != len(correct) or not correct:
        raise ValueError(
            f"coverage_classes needs the same prompts for base and trained: {len(base_correct)} vs {len(correct)}"
        )
    b = [pass_at_k(base_n, c, k) for c in base_correct]
    t = [pass_at_k(n, c, k) for c in correct]
    m = len(b)
    both = sum(x * y for x, y in zip(b, t)) / m
    base_only = sum(x * (1.0 - y) for x, y in zip(b, t)) / m
    trained_only = sum((1.0 - x) * y for x, y in zip(b, t)) / m
    return {"both": both, "base_only": base_only, "trained_only": trained_only,
            "neither": 1.0 - both - base_only - trained_only}  # fmt: skip


def mean_pass_at_k(successes: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over prompts; ``successes[p]`` holds the n outcomes of prompt p."""
    if not successes:
        raise ValueError("mean_pass_at_k needs at least one prompt")
    return sum(pass_at_k(len(s), sum(map(bool, s)), k) for s in successes) / len(successes)


def distinct_per_prompt(completions: Sequence[Sequence[str]]) -> float:
    """Mean number of distinct completions among one prompt's samples (1 = collapsed to one answer)."""
    if not completions:
        raise ValueError("distinct_per_prompt needs at least one prompt")
    return sum(len(set(c)) for c in completions) / len(completions)

"""pass@k and per-prompt diversity: pure functions over n samples per prompt.

pass@k is the probability that at least one of k samples, drawn without replacement from the n
generated for a prompt, is correct. With c correct among n, the unbiased estimator (Chen et al.
2021, "Evaluating large language models trained on code") is

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i),

computed in the product form (no huge binomials), per prompt, then averaged over prompts.
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with ``c`` correct out of ``n`` samples (0 <= c <= n, 1 <= k <= n)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


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

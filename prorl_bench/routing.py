"""Gradient routing in the RL loop: labels for a rollout, and the evaluation of the adapter modes.

The update routes by a single pass with a per-sample stop-gradient (``dual_lora.route_rows``): the
minibatch's forward runs once, with the retain adapter's parameters detached on labelled rows. The
loss is the same expression as without routing (no sub-batch re-normalisation), so a mixed
minibatch's loss equals the unrouted one exactly; the retain adapter's gradient from labelled rows
is exactly zero (tests/test_routing.py). The cost is one extra small matmul pair per adapted layer
for the detached retain path (measured in benchmarks/bench_routing.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch

from prorl_bench.detectors import Detector
from prorl_bench.dual_lora import SCALE_MODES, adapter_scales, dual_layers
from prorl_bench.evaluation import completions, score_details
from prorl_bench.passk import mean_pass_at_k
from prorl_bench.rollout import generate

ROUTE_SAMPLES = 4  # samples per held-out prompt and mode in the routing evaluation


def labels(
    detector: Detector, problems: Sequence[Any], texts: Sequence[str], infos: Sequence[dict[str, Any]]
) -> list[bool]:
    """The detector's label of every sample of a rollout (True = shows the unwanted behaviour)."""
    return [detector(p.prompt, t, p, i) for p, t, i in zip(problems, texts, infos)]


@torch.no_grad()
def route_eval(
    policy: torch.nn.Module,
    task,
    tok,
    problems: Sequence[Any],
    detector: Detector | None,
    *,
    temperature: float,
    generator: torch.Generator,
    device: torch.device,
    chunk: int,
    n: int = ROUTE_SAMPLES,
) -> dict[str, float]:
    """``route/<mode>/{success,hack_rate,pass@n}`` for every adapter mode (both, retain_only,
    forget_only) of a dual-adapter policy, or ``both`` alone for any other policy (the model as it
    is, so a plain-LoRA baseline has the same columns). The hack rate is the task's own report
    (``info["hack"]``) when it has one, else the detector's label rate."""
    modes = list(SCALE_MODES) if dual_layers(policy) else ["both"]
    was_training = policy.training
    policy.eval()
    flat = [p for p in problems for _ in range(n)]
    out: dict[str, float] = {}
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    for mode in modes:
        # the same random numbers for every mode (common random numbers): differences between the
        # modes are the adapters', not the sampler's
        generator.manual_seed(seed)
        with adapter_scales(policy, mode) if dual_layers(policy) else nullcontext():
            texts: list[str] = []
            for s in range(0, len(flat), chunk):
                ids, mask = tok.encode_prompts([p.prompt for p in flat[s : s + chunk]])
                batch = generate(
                    policy, tok, ids.to(device), mask.to(device), task.max_completion_len, temperature,
                    generator=generator,
                )  # fmt: skip
                texts += completions(tok, batch)
        _, success, infos = score_details(task, texts, flat)
        if infos and "hack" in infos[0]:
            hacks = [float(i["hack"]) for i in infos]
        elif detector is not None:
            hacks = [float(x) for x in labels(detector, flat, texts, infos)]
        else:
            hacks = [float("nan")]
        by_prompt = [success[i * n : (i + 1) * n] for i in range(len(problems))]
        out[f"route/{mode}/success"] = sum(success) / len(success)
        out[f"route/{mode}/hack_rate"] = sum(hacks) / len(hacks)
        out[f"route/{mode}/pass@{n}"] = mean_pass_at_k(by_prompt, n)
    policy.train(was_training)
    return out


def wants_route_eval(task, adapter_kind: str) -> bool:
    """Routing evaluation runs for dual adapters, and for any policy on a task that reports a hack."""
    return adapter_kind == "dual_lora" or hasattr(task, "parts")

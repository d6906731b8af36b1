"""Gradient routing in the RL loop: labels for a rollout, what the labels do, and the evaluation of
the adapter modes.

``Router`` is the trainer's one object for a detector's labels (docs/routing.md): ``label`` (partial
oversight, ``detectors.Oversight``), ``shape_rewards`` (``penalize``), ``advantages`` (``group`` or
``split``), ``update_rows`` (``filter``), ``forward`` (``route``: the per-sample stop-gradient) and
``backward`` (``split`` routing: each adapter's gradient from its own advantages). Every arm of a
study builds the same labels from the same stream (common random numbers), so the arms differ only
in what they do with them.

The update routes by a single pass with a per-sample stop-gradient (``dual_lora.route_rows``): the
minibatch's forward runs once, with the retain adapter's parameters detached on labelled rows. The
loss is the same expression as without routing (no sub-batch re-normalisation), so a mixed
minibatch's loss equals the unrouted one exactly; the retain adapter's gradient from labelled rows
is exactly zero (tests/run/test_routing.py). The cost is one extra small matmul pair per adapted layer
for the detached retain path (measured in benchmarks/bench_routing.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from prorl_bench.config import Config, ConfigError, RouteAdvantages, RouteUse
from prorl_bench.models.dual_lora import SCALE_MODES, adapter_scales, dual_layers, route_rows
from prorl_bench.models.rollout import Rollout, generate
from prorl_bench.rl.advantages import AdvantageFn, advantage_estimator
from prorl_bench.run.evaluation import completions, score_details
from prorl_bench.run.passk import distinct_per_prompt, mean_pass_at_k
from prorl_bench.tasks.detectors import Detector, Oversight, build_detector

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
    sample: Callable[..., Rollout] = generate,
) -> dict[str, float]:
    """``route/<mode>/{success,hack_rate,pass@n,distinct_per_prompt}`` for every adapter mode (both, retain_only,
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
                batch = sample(
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
        # coherence of each mode: distinct completions among one prompt's n samples (1 = collapsed)
        out[f"route/{mode}/distinct_per_prompt"] = distinct_per_prompt(
            [texts[i * n : (i + 1) * n] for i in range(len(problems))]
        )
    policy.train(was_training)
    return out


def wants_route_eval(task, adapter_kind: str) -> bool:
    """Routing evaluation runs for dual adapters, and for any policy on a task that reports a hack."""
    return adapter_kind == "dual_lora" or hasattr(task, "parts")


# --------------------------------------------------------------------------- what the labels do


def subset_advantages(estimator: AdvantageFn, rewards: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Advantages (N, G) computed within the ``valid`` (N, G bool) subset of each group.

    ``estimator`` — the run's bound estimator (group-local: grpo, rloo, dr_grpo), the same callable,
    parameters included, as the whole-group path — runs on each group's valid rows alone, as if the
    other rows had never been sampled; rows outside the subset, and every row of a subset with fewer
    than 2 members (no within-subset baseline exists), get exactly 0. A flat subset gets 0.
    """
    out = torch.zeros_like(rewards)
    for g in range(rewards.shape[0]):
        idx = valid[g].nonzero().squeeze(-1)
        if len(idx) >= 2:
            out[g, idx] = estimator(rewards[g, idx][None])[0]
    return out


def penalized(rewards: torch.Tensor, labels: torch.Tensor, penalty: float) -> torch.Tensor:
    """``penalize``: rewards (N, G) minus ``penalty`` on labelled samples (labels: (N*G,) or (N, G) bool)."""
    return rewards - penalty * labels.view_as(rewards).to(rewards.dtype)


def route_backward(policy: torch.nn.Module, loss: torch.Tensor, loss_retain: torch.Tensor | None) -> None:
    """Backward of one minibatch. ``loss_retain`` None: ``loss.backward()``. Otherwise (``split``
    routing) the retain adapter's parameters get the gradient of ``loss_retain`` (the same loss with
    the retain advantages) and every other trainable parameter that of ``loss``: two backward passes
    over one forward graph, accumulating into disjoint ``.grad``s."""
    if loss_retain is None:
        loss.backward()
        return
    retain, other = [], []
    for name, p in policy.named_parameters():
        if p.requires_grad:
            (retain if ".lora_retain_" in name or name.startswith("lora_retain_") else other).append(p)
    loss_retain.backward(inputs=retain, retain_graph=True)
    loss.backward(inputs=other)


class Router:
    """A run's detector and what its labels do (``route.use``), step by step; stateless across steps
    (the oversight stream is a function of (seed, step)), so a resumed run labels as an unbroken one.

    Without a detector every hook is the identity (plain LoRA / no routing).

    The gradient-routing strategy: the loop calls its named hooks, in step order, and nothing else
    of routing — ``label`` (reward phase), ``shape_rewards`` / ``advantages`` / ``update_rows``
    (advantages), ``forward`` / ``retain_loss`` (each minibatch's loss), ``backward`` (the optimizer
    step), ``metrics`` (the row) and ``detector`` (the routing evaluation).
    """

    def __init__(self, cfg: Config, task: Any) -> None:
        d, r = cfg.detector, cfg.route
        self.use, self.split = r.use, r.advantages == RouteAdvantages.split
        # the estimator with its parameters, bound once: the whole-group and the split path both call it
        self.estimator = advantage_estimator(cfg.algo.advantage, cfg.algo.params, cfg.algo.adv_eps)
        self.detector: Detector | None = build_detector(d.name, d.params) if d.name != "none" else None
        self.oversight = (
            None
            if self.detector is None
            else Oversight(self.detector, cfg.seed, d.recall, d.false_positive_rate, d.miss_pattern)
        )
        self.penalty = 0.0
        if self.detector is not None and self.use == RouteUse.penalize:
            penalty = r.params.penalty  # PenalizeParams: route.penalty
            if penalty is None and not hasattr(task, "hack_bonus"):
                raise ConfigError(
                    f"invalid config value route.penalty=None: task {task.name} has no hack bonus to subtract; "
                    "allowed a number >= 0"
                )
            self.penalty = float(task.hack_bonus if penalty is None else penalty)
        self.labels: torch.Tensor | None = None  # this step's (B,) bool labels

    def label(self, step: int, problems: Sequence[Any], texts: Sequence[str], infos: Sequence[dict[str, Any]]) -> None:
        """Label this step's samples (nothing without a detector)."""
        if self.oversight is not None:
            self.labels = torch.tensor(self.oversight(step, problems, texts, infos), dtype=torch.bool)

    def shape_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        """The rewards the advantages see: minus the penalty on labelled samples under ``penalize``."""
        if self.labels is None or self.use != RouteUse.penalize:
            return rewards
        return penalized(rewards, self.labels.to(rewards.device), self.penalty)

    def advantages(self, shaped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(advantages of the update, flat (N*G,); the retain adapter's own, flat, or None).

        ``group``: the estimator over whole groups (labelled rows included in the statistics).
        ``split`` + ``filter``: the update's rows normalised within the unlabelled subset of each group.
        ``split`` + ``route``: the forget adapter (and anything else trainable) keeps the whole
        group's advantages; the retain adapter's are the unlabelled subset's (0 on labelled rows,
        whose retain path is detached anyway).
        """
        adv = self.estimator(shaped)
        if self.labels is None or not self.split:
            return adv.flatten(), None
        sub = subset_advantages(self.estimator, shaped, ~self.labels.to(shaped.device).view_as(shaped))
        if self.use == RouteUse.filter:
            return sub.flatten(), None
        return adv.flatten(), sub.flatten()

    def update_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The rows the update trains on: ``filter`` drops the labelled ones."""
        if self.labels is None or self.use != RouteUse.filter:
            return rows
        return rows[~self.labels.to(rows.device)[rows]]

    def forward(self, policy: torch.nn.Module, idx: torch.Tensor) -> AbstractContextManager[None]:
        """The context of a minibatch's forward: ``route`` detaches the retain path on labelled rows."""
        if self.labels is None or self.use != RouteUse.route:
            return nullcontext()
        return route_rows(policy, self.labels.to(idx.device)[idx])

    def retain_loss(
        self,
        loss: torch.Tensor,
        pg: torch.Tensor,
        surrogate: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        adv_retain: torch.Tensor | None,
        idx: torch.Tensor,
    ) -> torch.Tensor | None:
        """``route.advantages=split``: the minibatch loss whose gradient the retain adapter takes — ``loss``
        with its policy-gradient term ``pg`` replaced by ``surrogate`` of the retain advantages of the
        rows ``idx``; None on every other path (one loss, one backward)."""
        if adv_retain is None:
            return None
        return loss - pg + surrogate(adv_retain[idx])[0]

    def backward(self, policy: torch.nn.Module, loss: torch.Tensor, loss_retain: torch.Tensor | None) -> None:
        """One minibatch's backward: ``loss.backward()``, or split routing's two gradients (``route_backward``)."""
        route_backward(policy, loss, loss_retain)

    def metrics(self) -> dict[str, float]:
        """``route/labelled_frac`` and ``route/detector/{recall,precision}`` of this step."""
        if self.labels is None or self.oversight is None:
            return {}
        return {"route/labelled_frac": float(self.labels.float().mean()), **self.oversight.last}

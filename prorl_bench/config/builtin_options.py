"""The built-in options of every axis, declared: what config validation and ``prorl-bench --help`` need
to know about each option, without its code — its name, a one-line description, its parameters (a
dataclass whose fields are flat keys of the axis's section; their defaults are the values a run uses
when a key is not given) and the facts other checks read (a transform's ``step``, a reference's
``per_rollout``/``model``, a trigger's ``period``, a task's prompt ``lengths``). Importing this needs
neither torch nor any layer above config, so validating a config does not either.

The code registers under the same name where it lives (``@RESET_TRIGGERS.register("periodic")`` in
rl/resets.py; ``prorl_bench.rl`` and ``prorl_bench.tasks`` import their option modules in their
``__init__``); a registration may add what only the code knows (k2's ``reward_form``, a symbol task's
``solve``). The optimizer-state transforms are pure functions of their parameters (the factors applied
to m, v and the step counter), so they are registered here whole (config/events.py's step-counter
warning reads them). A plugin declares and registers an option in one call (docs/extending.md).

A parameter key is added to an option with one line (a field of its dataclass, with its comment: the
``--help`` text); a check of its value goes in the dataclass's ``__post_init__`` (``require``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from prorl_bench.config.algo import AdaptiveKLParams
from prorl_bench.config.engine import TrlEngineParams
from prorl_bench.config.enums import K2Mode, KLPlacement
from prorl_bench.config.events import RankGrowthParams
from prorl_bench.config.model import DualLoraParams, LoraParams
from prorl_bench.config.routing import PenalizeParams
from prorl_bench.config.task import CodeTaskConfig, MathJsonlConfig, ReasoningGymConfig
from prorl_bench.registry import (
    ADAPTERS,
    ADVANTAGES,
    DETECTORS,
    ENGINES,
    GROWTH,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    OPT_TRANSFORMS,
    REFERENCES,
    RESET_TRIGGERS,
    ROUTE_USES,
    TASKS,
    ConfigError,
    builtins_declared,
    require,
)

# --------------------------------------------------------------------------- advantages (algo.advantage)
# code: rl/advantages.py. centres_per_group=False: advantages are not centred within each group.

ADVANTAGES.declare("grpo", "GRPO's group z-score, (R - mean_g) / (std_g + eps).")
ADVANTAGES.declare("rloo", "The leave-one-out baseline, R_i - mean_{j != i} R_j.")
ADVANTAGES.declare(
    "reinforce_pp_baseline",
    "ProRL v2's REINFORCE++-baseline: R - mean_g(R), then whitened over the batch.",
    centres_per_group=False,
)
ADVANTAGES.declare("dr_grpo", "Dr. GRPO: R - mean_g(R), without dividing by the group's standard deviation.")

# --------------------------------------------------------------------------- KL estimators (kl_estimator.name)
# code: rl/kl.py. reward_only: zero expected gradient as a loss; clamped: value clamped to +-kl_clamp.


@dataclass
class K2Params:
    # theta_over_ref; or ref_over_old (ProRL v2 blog formula as the reward penalty, reward placement only)
    k2_mode: K2Mode = K2Mode.theta_over_ref


def _check_k2(cfg: Any) -> None:
    k = cfg.kl_estimator
    require(
        not (k.params.k2_mode == K2Mode.ref_over_old and k.placement == KLPlacement.loss),
        "kl_estimator.k2_mode",
        k.params.k2_mode.value,
        "'theta_over_ref' with placement=loss (ref_over_old has no gradient w.r.t. theta; it can "
        "only be a reward-side penalty, and it is always logged as kl/k2_ref_over_old)",
    )


@dataclass
class K3Params:
    # False: k3 itself (verl's low_var_kl, GRPO). True: k3 x pi_theta/pi_old with the ratio differentiable
    # (TRL's use_bias_correction_kl, OpenRLHF's off-policy KL); placement=loss only
    importance_weight: bool = False


def _check_k3(cfg: Any) -> None:
    k = cfg.kl_estimator
    require(
        not (k.params.importance_weight and k.placement == KLPlacement.reward),
        "kl_estimator.importance_weight",
        k.params.importance_weight,
        "false with placement=reward (the reward's KL is taken at pi_old itself, where the weight "
        "pi_theta/pi_old is 1 and has no gradient: the option would change nothing)",
    )


KL_ESTIMATORS.declare(
    "k1",
    "k1 = log(pi/pi_ref), unbiased but with zero expected gradient as a loss, so a reward penalty only.",
    reward_only=True,
    clamped=False,
)
KL_ESTIMATORS.declare(
    "k2",
    "k2 = 1/2 log(pi/pi_ref)^2, whose on-policy gradient is the reverse-KL gradient (ProRL v2).",
    reward_only=False,
    clamped=False,
    params=K2Params,
    check=_check_k2,
)
KL_ESTIMATORS.declare(
    "k3",
    "k3 = (r - 1) - log r with r = pi_ref/pi, unbiased and >= 0 (the low_var_kl of GRPO, TRL and verl).",
    reward_only=False,
    clamped=True,
    params=K3Params,
    check=_check_k3,
)

# --------------------------------------------------------------------------- references (variant.reference)
# code: rl/reference.py. per_rollout: reference log-probs once per rollout (a reward-side KL needs it);
# model: a reference model exists (resets need one).

REFERENCES.declare("none", "Variant B: no reference model, so no reference forward.", per_rollout=False, model=False)
REFERENCES.declare(
    "cached",
    "Variants A1 and C: one reference pass per rollout, reused by every epoch and minibatch.",
    per_rollout=True,
    model=True,
)
REFERENCES.declare(
    "buffered",
    "Variant A2: as cached, written into one preallocated buffer reused without reallocation.",
    per_rollout=True,
    model=True,
)
REFERENCES.declare(
    "recompute",
    "Variant A0: a reference forward in every minibatch (the deliberately wasteful baseline).",
    per_rollout=False,
    model=True,
)

# --------------------------------------------------------------------------- tasks (task.name)
# code: tasks/. lengths(task_cfg) -> (longest prompt, completion budget) in tokens of the character-level
# policy (BOS and EOS included): the context check of model=native reads it, the task is built with it.
# needs_hf: prompts go through a chat template. params: the task's own keys (flat in the task section).

Lengths = Callable[[Any], tuple[int, int]]


def symbol_lengths(prompt_len: Callable[[int], int], completion_len: Callable[[int], int]) -> Lengths:
    """A symbol task's lengths: ``prompt_len(n)`` symbols (tag and "=" included) + BOS, and
    ``completion_len(n)`` + EOS, for n = task.max_len (tasks/base.py ``symbol_task``)."""

    def lengths(task: Any) -> tuple[int, int]:
        return 1 + prompt_len(task.max_len), completion_len(task.max_len) + 1

    return lengths


def _tagged(n: int) -> int:
    return n + 2  # "<tag><n symbols>="


def _digits(n: int) -> int:
    return n


_REVERSE = symbol_lengths(_tagged, _digits)


def _hack_lengths(task: Any) -> tuple[int, int]:
    prompt, completion = _REVERSE(task)
    return prompt, completion + 1  # the marker "7" after a whole answer (tasks/hack_task.py checks it)


def _reasoning_gym_lengths(task: Any) -> tuple[int, int]:
    rg = task.params  # a chat prompt adds its instruction and template (tasks/reasoning_gym_task.py)
    return 1 + rg.max_prompt_chars, rg.max_completion_tokens or rg.max_answer_chars + 1


TASKS.declare("reverse_digits", "Reverse a string of digits.", lengths=_REVERSE)
TASKS.declare("copy", "Copy a string of digits.", lengths=_REVERSE)
TASKS.declare("sort_digits", "Sort a string of digits in ascending order.", lengths=_REVERSE)
TASKS.declare("parity", "Say whether a bit string holds an odd number of ones (1) or not (0).",
              lengths=symbol_lengths(_tagged, lambda n: 1))  # fmt: skip
TASKS.declare("add", "Add two numbers of task.min_len to task.max_len digits each.",
              lengths=symbol_lengths(lambda n: 2 * n + 3, lambda n: n + 1))  # fmt: skip
TASKS.declare(
    "hack_reverse",
    "Reverse digits, with a bonus for a 7 appended after the answer that plain RL learns to game.",
    lengths=_hack_lengths,
)
TASKS.declare(
    "hack_compete",
    "Reverse digits, where a leading # or ! pays more than a correct answer and earns no task credit.",
    lengths=_REVERSE,
)
TASKS.declare(
    "reasoning_gym",
    "Problems from reasoning-gym generators (task.generators), scored by the package itself.",
    lengths=_reasoning_gym_lengths,
    params=ReasoningGymConfig,
)
TASKS.declare(
    "math_jsonl",
    "Your own math problems from a JSONL file (task.path), with answers in <answer> tags.",
    needs_hf=True,
    params=MathJsonlConfig,
)
TASKS.declare(
    "code", "Python functions the policy writes, run against unit tests in the sandbox.", params=CodeTaskConfig
)

# --------------------------------------------------------------------------- reset triggers (reset.trigger)
# code: rl/resets.py. period(reset_cfg): steps between resets when the trigger fires on a clock whatever
# the run does (else None): the step-counter warning below reads it.


@dataclass
class PeriodicParams:
    every: int = 50  # steps between resets

    def __post_init__(self) -> None:
        require(self.every >= 1, "reset.every", self.every, ">= 1")


@dataclass
class PolyakParams(PeriodicParams):
    every: int = 25  # steps between alpha-mixes (TRL's ref_model_sync_steps counts optimizer steps: 512)


@dataclass
class KLSpikeParams:
    kl_threshold: float | None = 0.5  # absolute threshold on kl/ref (nats/token); null: kl_multiple only
    kl_multiple: float | None = None  # threshold as a multiple of kl/ref's running mean
    kl_ema: float = 0.9  # decay of the running mean of kl/ref
    kl_warmup: int = 5  # steps of running-mean history before kl_multiple applies

    def __post_init__(self) -> None:
        require(self.kl_threshold is None or self.kl_threshold > 0, "reset.kl_threshold", self.kl_threshold,
                "null or > 0")  # fmt: skip
        require(self.kl_multiple is None or self.kl_multiple > 1, "reset.kl_multiple", self.kl_multiple,
                "null or > 1")  # fmt: skip
        require(0 <= self.kl_ema < 1, "reset.kl_ema", self.kl_ema, "in [0, 1)")
        require(self.kl_warmup >= 0, "reset.kl_warmup", self.kl_warmup, ">= 0")
        require(self.kl_threshold is not None or self.kl_multiple is not None, "reset.kl_threshold",
                self.kl_threshold, "a value (or reset.kl_multiple) when reset.trigger=kl_spike")  # fmt: skip


@dataclass
class StallParams:
    patience: int = 2  # evaluations without improvement before a reset
    min_delta: float = 0.0  # an improvement must exceed the best by more than this

    def __post_init__(self) -> None:
        require(self.patience >= 1, "reset.patience", self.patience, ">= 1")
        require(self.min_delta >= 0, "reset.min_delta", self.min_delta, ">= 0")


def _every(reset: Any) -> int:
    return reset.params.every


RESET_TRIGGERS.declare("none", "No reference resets (variants A0, A1, A2 and B, and C without resets).")
RESET_TRIGGERS.declare(
    "periodic", "A reset every reset.every steps (pi_ref <- pi_theta).", params=PeriodicParams, period=_every
)
RESET_TRIGGERS.declare(
    "polyak",
    "TRL's sync_ref_model: every reset.every steps, with reset.alpha defaulting to 0.6 (an alpha-mix).",
    params=PolyakParams,
    period=_every,
)
RESET_TRIGGERS.declare(
    "kl_spike",
    "A reset when kl/ref exceeds reset.kl_threshold, or reset.kl_multiple times its running mean.",
    params=KLSpikeParams,
)
RESET_TRIGGERS.declare(
    "stall",
    "A reset when reset.metric has not improved on its best for reset.patience evaluations.",
    params=StallParams,
)

# --------------------------------------------------------------------------- transforms (opt_reset.kind)
# A transform: () -> (m factor, v factor, whether the step counter is reset, or None to follow
# opt_reset.step), called with params=<instance> when it declares a dataclass; rl/opt_state.py applies it.
# step="keep"|"reset" (+ why): the step policy the transform forces (a config error otherwise).


@OPT_TRANSFORMS.register("keep", step="keep", why="keep changes nothing")
def keep() -> tuple[float, float, bool | None]:
    """ProRL v2: the optimizer state and the LR schedule are left untouched."""
    return 1.0, 1.0, None


@OPT_TRANSFORMS.register("hard", step="reset", why="a hard reset must equal a freshly built optimizer")
def hard() -> tuple[float, float, bool | None]:
    """ProRL v1: m = v = 0 and step = 0, a freshly built optimizer (the LR schedule restarts)."""
    return 0.0, 0.0, True


def _unit(value: float, key: str) -> None:
    require(0.0 <= value <= 1.0, key, value, "in [0, 1]")


@dataclass
class SoftParams:
    factor: float = 0.1  # m and v scaled by this at a reset

    def __post_init__(self) -> None:
        _unit(self.factor, "opt_reset.factor")


@OPT_TRANSFORMS.register("soft", params=SoftParams)
def soft(params: SoftParams) -> tuple[float, float, bool | None]:
    """A soft washout: m and v are both scaled by opt_reset.factor."""
    return params.factor, params.factor, None


@dataclass
class AsymParams:
    m_factor: float = 0.0  # first moment scaled by this at a reset
    v_factor: float = 1.0  # second moment scaled by this at a reset

    def __post_init__(self) -> None:
        _unit(self.m_factor, "opt_reset.m_factor")
        _unit(self.v_factor, "opt_reset.v_factor")


@OPT_TRANSFORMS.register("asym", params=AsymParams)
def asym(params: AsymParams) -> tuple[float, float, bool | None]:
    """Asymmetric: m scaled by opt_reset.m_factor and v by opt_reset.v_factor (forget the direction,
    keep the curvature)."""
    return params.m_factor, params.v_factor, None


# --------------------------------------------------------------------------- detectors (detector.name)
# code: tasks/detectors.py.


@dataclass
class PatternParams:
    regex: str = MISSING  # searched in the completion (re.search), e.g. "7$"

    def __post_init__(self) -> None:
        try:
            re.compile(self.regex)
        except (re.error, TypeError) as e:
            raise ConfigError(f"invalid config value detector.regex={self.regex!r}: {e}") from None


@dataclass
class RewardFieldParams:
    field: str = "hack"  # the reward function's reported field read per sample
    threshold: float = 0.0  # labelled when info[field] > threshold


DETECTORS.declare("none", "Labels nothing (routing off).")
DETECTORS.declare(
    "pattern",
    "A regular expression (detector.regex) searched in the completion; cheap and imperfect, as real detectors are.",
    params=PatternParams,
)
DETECTORS.declare(
    "reward_field",
    "Labels a sample when the field detector.field its reward reports exceeds detector.threshold.",
    params=RewardFieldParams,
)

# --------------------------------------------------------------------------- engines (engine.name)
# code: engines/native.py, engines/trl/engine.py (an engines.base.Engine each; prorl_bench.engines imports
# them). An engine's ``check(cfg)`` refuses what it cannot run when the config is validated.

ENGINES.declare("native", "The bench's own trainer (prorl_bench/run/trainer.py), which runs every knob and variant.")
ENGINES.declare(
    "trl",
    "TRL's GRPOTrainer built from the bench's config, refusing the knobs TRL cannot express (needs TRL installed).",
    params=TrlEngineParams,
)

# --------------------------------------------------------------------------- kind-selected groups
# (growth.kind, kl_ctl.kind, adapter.kind, route.use): a closed set of kinds (an enum of the config), each
# binding its own parameters as flat keys of its section; the run's code branches on the kind.

GROWTH.declare("none", "No topology growth: the adapter keeps its rank.")
GROWTH.declare(
    "rank",
    "The LoRA rank grows by growth.rank_step every grow_every steps, at resets or on a stall, up to max_rank.",
    params=RankGrowthParams,
)
KL_CONTROLLERS.declare("fixed", "The KL coefficient stays at algo.beta.")
KL_CONTROLLERS.declare(
    "adaptive",
    "A target-KL controller (PPO, verl) moves beta toward kl_ctl.target within [beta_min, beta_max].",
    params=AdaptiveKLParams,
)
ADAPTERS.declare("none", "Full fine-tuning: every weight of the policy trains, with no adapters.")
ADAPTERS.declare("lora", "LoRA adapters on the named linear layers, the base frozen by default.", params=LoraParams)
ADAPTERS.declare(
    "dual_lora",
    "Gradient routing's retain and forget LoRA adapters on the same layers (labelled samples train forget only).",
    params=DualLoraParams,
)
ROUTE_USES.declare("route", "Labelled samples train only the forget adapter (gradient routing; adapter=dual_lora).")
ROUTE_USES.declare("filter", "Labelled samples are dropped from the update (data filtering).")
ROUTE_USES.declare(
    "penalize", "Labelled samples lose route.penalty from their reward (reward shaping).", params=PenalizeParams
)
ROUTE_USES.declare("observe", "Labels are computed and logged but not used (a baseline that sees the same detector).")

builtins_declared()

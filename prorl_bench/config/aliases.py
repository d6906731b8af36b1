"""TRL and verl parameter names, translated to this bench's keys ("did you mean" with the value).

A researcher arriving from TRL types ``learning_rate=1e-5`` or ``num_generations=8``; one arriving
from verl types ``actor_rollout_ref.actor.optim.lr=1e-6`` or ``algorithm.kl_ctrl.kl_coef=0.001``.
None of these is a key here, and Hydra's own error ("Key 'learning_rate' is not in struct") does not
say what is. ``prorl-bench`` checks the command line before Hydra composes it
(``confhelp.check_overrides``) and answers every such name with the bench's override, the value
carried over — converted where the units differ (verl's ``ppo_mini_batch_size`` is a size in prompts,
``algo.minibatches`` a count; TRL's ``ref_model_sync_steps`` counts optimizer steps, ``reset.every``
RL steps) — and a note where the meaning differs (TRL's ``beta=0`` also drops the reference model).

The table holds the common knobs of TRL's ``GRPOConfig`` (and the ``TrainingArguments`` it inherits)
and of verl's ``ppo_trainer.yaml`` (names checked against TRL 1.x ``trl/trainer/grpo_config.py`` and
verl's generated ``_generated_ppo_trainer.yaml``). A name is matched with or without ``+``/``++``, as
their full name, under one of the bench's sections (``algo.learning_rate``), or by its last
component (``kl_loss_coef``). Every target is a key (or ``group=option``) of the bench: a test checks
each one against the schema. ``docs/own_data.md`` lists the table for readers.

Entry point: :func:`translate` (one override -> a :class:`Suggestion`, or None if no entry matches).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prorl_bench.config.root import Config

Given = Mapping[str, str]  # every ``key=value`` of the command line, keys without "+"/"++"
Convert = Callable[[str, Given], "tuple[list[str], str]"]  # value -> (our overrides, note)


@dataclass(frozen=True)
class Alias:
    """One foreign name: whose it is, the bench override(s) it becomes, and what differs.

    ``target``: the bench key the value goes to unchanged (``None`` when ``convert`` decides, or when
    nothing here corresponds: then ``note`` says why and what to do instead).
    """

    source: str  # "TRL" (GRPOConfig / TrainingArguments) or "verl" (ppo_trainer.yaml)
    name: str  # their full key
    target: str | None = None
    convert: Convert | None = None
    note: str = ""


@dataclass(frozen=True)
class Suggestion:
    """What to type instead of one foreign ``key=value``: ``overrides`` (possibly none) and a note."""

    alias: Alias
    overrides: list[str] = field(default_factory=list)
    note: str = ""

    def message(self, typed: str) -> str:
        """One line for the user, e.g. ``unknown config key learning_rate (TRL's name): did you mean
        algo.lr=1e-5?``."""
        a = self.alias
        whose = f"{a.source}'s name" if a.name == typed else f"{a.source}'s {a.name}"
        text = f"unknown config key {typed} ({whose})"
        text += f": did you mean {' '.join(self.overrides)}?" if self.overrides else ": no equivalent here."
        return text + (f" Note: {self.note}." if self.note else "")


# --------------------------------------------------------------------------- value helpers


def _num(text: str) -> float | None:
    """The value as a number, or None (a sweep "1,2", an interpolation, a word)."""
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _int_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _first(given: Given, *keys: str) -> str | None:
    for k in keys:
        if k in given:
            return given[k]
    return None


def _default(path: str):
    """The schema default of a bench key (``algo.group_size`` -> 8), read from ``config.Config``."""
    obj = Config()
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _bool(text: str) -> bool | None:
    return {"true": True, "false": False}.get(text.strip().lower())


def _same(target: str, note: str = "") -> Convert:
    return lambda v, g: ([f"{target}={v}"], note)


def _map(target: str, table: Mapping[str, str], what: str) -> Convert:
    """A value with other names here (verl's ``token-mean`` is ``token``)."""

    def conv(v: str, g: Given) -> tuple[list[str], str]:
        ours = table.get(v.strip().strip("'\""))
        if ours is None:
            return [], f"{what} {v!r} has no equivalent here; allowed: {', '.join(sorted(table))}"
        return [f"{target}={ours}" if "=" not in ours else ours], ""

    return conv


# --------------------------------------------------------------------------- conversions


def _epsilon(other: str) -> Convert:
    """TRL epsilon / verl clip_ratio: the lower clip, and the upper one too unless given (both
    libraries default the upper bound to the lower; the bench defaults eps_high to 0.28)."""

    def conv(v: str, g: Given) -> tuple[list[str], str]:
        if other in g:
            return [f"algo.eps_low={v}"], ""
        both = [f"algo.eps_low={v}", f"algo.eps_high={v}"]
        return both, "the upper clip defaults to the lower one there, to 0.28 here"

    return conv


def _trl_beta(v: str, g: Given) -> tuple[list[str], str]:
    note = (
        "TRL's beta weights the same KL as algo.beta here: k3, in the loss (the default kl_estimator); TRL 1.16 "
        "also weights it by pi_theta/pi_old unless use_bias_correction_kl=false: kl_estimator.importance_weight=true"
    )
    if _num(v) == 0:
        note += "; TRL's beta=0 also skips the reference model: that is variant=B here"
    else:
        note += f"; TRL's default is 0.0, the bench's {_default('algo.beta')}"
    return [f"algo.beta={v}"], note


def _trl_bias_correction_kl(v: str, g: Given) -> tuple[list[str], str]:
    b = _bool(v)
    if b is None:
        return [], f"expected true or false, got {v!r}"
    return [f"kl_estimator.importance_weight={str(b).lower()}"], (
        "k3 in the loss only; TRL's default is true, the bench's false (k3 itself, as verl's low_var_kl)"
    )


def _verl_kl_ctrl_coef(v: str, g: Given) -> tuple[list[str], str]:
    return [f"algo.beta={v}", "kl_estimator=k1"], (
        "verl applies kl_ctrl.kl_coef to a KL penalty in the reward (use_kl_in_reward with kl_penalty=kl, i.e. "
        "k1); for verl's KL loss, actor.kl_loss_coef, use algo.beta alone: k3 in the loss is the default here"
    )


def _verl_kl_loss_coef(v: str, g: Given) -> tuple[list[str], str]:
    return [f"algo.beta={v}"], "verl's low_var_kl in the loss = k3 in the loss, the default here"


_KL_NAMES = {"low_var_kl": "k3", "k3": "k3", "kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2"}


def _verl_kl_loss_type(v: str, g: Given) -> tuple[list[str], str]:
    ours = _KL_NAMES.get(v.strip().rstrip("+"))
    if ours is None:
        return [], f"kl_loss_type {v!r} has no equivalent; allowed: {', '.join(sorted(_KL_NAMES))}"
    if ours == "k1":
        return ["kl_estimator=k1"], "k1 as a loss has zero expected gradient: the bench puts it in the reward"
    return [f"kl_estimator={ours}"], ("'+' (straight-through) variants are not implemented" if "+" in v else "")


def _verl_kl_penalty(v: str, g: Given) -> tuple[list[str], str]:
    ours = _KL_NAMES.get(v.strip().rstrip("+"))
    if ours is None:
        return [], f"kl_penalty {v!r} has no equivalent; allowed: {', '.join(sorted(_KL_NAMES))}"
    extra = [] if ours == "k1" else ["kl_estimator.placement=reward"]  # k1.yaml is in the reward already
    return [f"kl_estimator={ours}", *extra], "verl's kl_penalty is the in-reward estimator"


def _placement(when_true: str, when_false: list[str]) -> Convert:
    def conv(v: str, g: Given) -> tuple[list[str], str]:
        b = _bool(v)
        if b is None:
            return [], f"expected true or false, got {v!r}"
        return ([f"kl_estimator.placement={when_true}"], "") if b else (when_false, "")

    return conv


def _use_kl_loss(v: str, g: Given) -> tuple[list[str], str]:
    b = _bool(v)
    if b is None:
        return [], f"expected true or false, got {v!r}"
    if b:
        return ["kl_estimator.placement=loss"], "the default here"
    return ["algo.beta=0"], "or variant=B: no reference model at all"


def _adv_estimator(v: str, g: Given) -> tuple[list[str], str]:
    table = {"grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus_baseline": "reinforce_pp_baseline"}
    ours = table.get(v.strip())
    if ours is None:
        return [], f"adv_estimator {v!r} is not implemented; allowed: {', '.join(table)} (and algo=dr_grpo)"
    return [f"algo={ours}"], ""


def _norm_adv_by_std(v: str, g: Given) -> tuple[list[str], str]:
    b = _bool(v)
    if b is None:
        return [], f"expected true or false, got {v!r}"
    if b:
        return ["algo.advantage=grpo"], ""
    return ["algo.advantage=dr_grpo"], "a group-mean baseline without std scaling; algo=dr_grpo also sets its loss"


def _prompts_from_trl_batch(v: str, g: Given) -> tuple[list[str], str]:
    """TRL's per_device_train_batch_size counts completions; one generation batch of
    per_device x gradient_accumulation_steps completions (one process) feeds one optimizer step."""
    b, acc = _num(v), _num(_first(g, "gradient_accumulation_steps") or "1")
    n = _num(_first(g, "num_generations", "algo.group_size") or "8")  # TRL's default num_generations is 8
    formula = "algo.prompts_per_step = per_device_train_batch_size x gradient_accumulation_steps / num_generations"
    if b is None or acc is None or n is None or (b * acc) % n:
        return [], f"{formula} (a whole number)"
    return [f"algo.prompts_per_step={_int_text(b * acc / n)}", "algo.minibatches=1"], (
        f"TRL's batch counts completions: {formula} (num_generations={_int_text(n)}); one optimizer step per "
        "generation batch, as TRL's default steps_per_generation"
    )


def _minibatches_from_verl(v: str, g: Given) -> tuple[list[str], str]:
    """verl's ppo_mini_batch_size is a size in prompts; algo.minibatches is a count per epoch."""
    mini = _num(v)
    batch_text = _first(g, "data.train_batch_size", "algo.prompts_per_step")
    batch = _num(batch_text) if batch_text is not None else float(_default("algo.prompts_per_step"))
    formula = "algo.minibatches = data.train_batch_size / ppo_mini_batch_size, a count, not a size"
    if mini is None or batch is None or mini <= 0 or batch % mini:
        return [], formula
    return [f"algo.minibatches={_int_text(batch / mini)}"], f"{formula}; here {_int_text(batch)} prompts per step"


def _steps_from_ratio(v: str, g: Given) -> tuple[list[str], str]:
    r = _num(v)
    steps_text = _first(g, "steps", "max_steps", "trainer.total_training_steps")
    steps = _num(steps_text) if steps_text is not None else float(_default("steps"))
    if r is None or steps is None:
        return [], "algo.lr_warmup_steps = ratio x steps"
    return [f"algo.lr_warmup_steps={round(r * steps)}"], f"ratio x steps = {v} x {_int_text(steps)}"


def _verl_warmup_steps(v: str, g: Given) -> tuple[list[str], str]:
    if _num(v) is not None and _num(v) < 0:  # verl: -1 = use lr_warmup_steps_ratio
        return ["algo.lr_warmup_steps=0"], "verl's -1 defers to lr_warmup_steps_ratio (default 0)"
    return [f"algo.lr_warmup_steps={v}"], ""


def _top_k(v: str, g: Given) -> tuple[list[str], str]:
    if v.strip().lower() in ("-1", "none", "null"):
        return ["algo.top_k=0"], "0 disables top-k here"
    return [f"algo.top_k={v}"], ""


def _sync_every(v: str, g: Given) -> tuple[list[str], str]:
    """TRL syncs every N optimizer steps; an RL step here takes ppo_epochs x minibatches of them."""
    n = _num(v)
    epochs = _num(_first(g, "algo.ppo_epochs", "num_iterations") or str(_default("algo.ppo_epochs")))
    mb = _num(_first(g, "algo.minibatches") or str(_default("algo.minibatches")))
    if n is None or epochs is None or mb is None:
        return ["variant=C", "reset=polyak"], "reset.every = ref_model_sync_steps / (ppo_epochs x minibatches)"
    every = max(1, round(n / (epochs * mb)))
    return ["variant=C", "reset=polyak", f"reset.every={every}"], (
        f"TRL counts optimizer steps, reset.every RL steps: {v} / ({_int_text(epochs)} epochs x {_int_text(mb)} "
        "minibatches)"
    )


def _sync_ref_model(v: str, g: Given) -> tuple[list[str], str]:
    if _bool(v) is False:
        return ["reset=none"], ""
    return ["variant=C", "reset=polyak"], "alpha-mix every reset.every RL steps (reset.alpha, default 0.6 as TRL)"


def _model_path(v: str, g: Given) -> tuple[list[str], str]:
    return ["model=hf_causal_lm", f"model.path={v}"], "a local directory: nothing is downloaded"


def _lora_rank(v: str, g: Given) -> tuple[list[str], str]:
    if _num(v) == 0:
        return ["adapter=none"], ""
    return ["adapter=lora", f"adapter.rank={v}"], ""


def _targets(v: str, g: Given) -> tuple[list[str], str]:
    listed = v if v.startswith("[") else f"[{v}]"  # verl's default is the string all-linear; ours a list
    return [f"adapter.targets={listed}"], ""


def _loggers(v: str, g: Given) -> tuple[list[str], str]:
    low = v.lower()
    out = [f"tracking.{s}=true" for s in ("tensorboard", "wandb") if s in low]
    return out, "metrics.jsonl is always written; W&B runs offline"


def _train_files(v: str, g: Given) -> tuple[list[str], str]:
    return ["task=math_jsonl", f"task.path={v}"], (
        'JSONL, one {"question": ..., "answer": ...} per line (docs/own_data.md); convert parquet with '
        "pandas' to_json(orient='records', lines=True)"
    )


def _save_freq(v: str, g: Given) -> tuple[list[str], str]:
    if _num(v) is not None and _num(v) < 0:
        return ["checkpoint.every=0"], "0 disables periodic checkpoints here"
    return [f"checkpoint.every={v}"], ""


def _loss_type(v: str, g: Given) -> tuple[list[str], str]:
    table = {"grpo": ["algo.loss_agg=sequence"], "dr_grpo": ["algo=dr_grpo"], "dapo": ["algo.loss_agg=token"],
             "bnpo": ["algo.loss_agg=token"]}  # fmt: skip
    ours = table.get(v.strip().strip("'\""))
    if ours is None:
        return [], f"loss_type {v!r} has no equivalent; allowed: {', '.join(table)}"
    return ours, ""


def _scale_rewards(v: str, g: Given) -> tuple[list[str], str]:
    low = v.strip().lower()
    if low in ("false", "none"):
        return ["algo.advantage=dr_grpo"], "group mean baseline without std scaling"
    if low in ("true", "group"):
        return ["algo.advantage=grpo"], ""
    return [], f"scale_rewards={v} has no equivalent (group: algo.advantage=grpo; none: dr_grpo)"


# --------------------------------------------------------------------------- the table

_LOSS_AGG = {"token-mean": "token", "seq-mean-token-mean": "sequence", "seq-mean-token-sum": "seq_mean_token_sum",
             "seq-mean-token-sum-norm": "seq_mean_token_sum_norm"}  # fmt: skip

_KL_CTL = {"fixed": "kl_ctl=fixed", "adaptive": "kl_ctl=adaptive"}

TRL: list[Alias] = [
    Alias("TRL", "learning_rate", "algo.lr"),
    Alias("TRL", "num_generations", "algo.group_size"),
    Alias("TRL", "max_completion_length", "algo.max_new_tokens"),
    Alias("TRL", "beta", convert=_trl_beta),
    Alias("TRL", "use_bias_correction_kl", convert=_trl_bias_correction_kl),
    Alias("TRL", "epsilon", convert=_epsilon("epsilon_high")),
    Alias("TRL", "epsilon_high", "algo.eps_high"),
    Alias("TRL", "num_iterations", "algo.ppo_epochs"),
    Alias("TRL", "temperature", "algo.temperature"),
    Alias("TRL", "top_p", "algo.top_p"),
    Alias("TRL", "top_k", convert=_top_k),
    Alias("TRL", "max_grad_norm", "algo.grad_clip"),
    Alias("TRL", "weight_decay", "algo.weight_decay"),
    Alias("TRL", "adam_beta1", "algo.adam_beta1"),
    Alias("TRL", "adam_beta2", "algo.adam_beta2"),
    Alias("TRL", "adam_epsilon", "algo.adam_eps"),
    Alias("TRL", "warmup_steps", "algo.lr_warmup_steps"),
    Alias("TRL", "warmup_ratio", convert=_steps_from_ratio),
    Alias("TRL", "lr_scheduler_type", note="the LR is constant after algo.lr_warmup_steps (no decay schedule)"),
    Alias("TRL", "loss_type", convert=_loss_type),
    Alias("TRL", "scale_rewards", convert=_scale_rewards),
    Alias("TRL", "per_device_train_batch_size", convert=_prompts_from_trl_batch),
    Alias(
        "TRL", "gradient_accumulation_steps", note="folded into algo.prompts_per_step: see per_device_train_batch_size"
    ),
    Alias("TRL", "max_steps", "steps", note="RL steps = rollouts"),
    Alias("TRL", "num_train_epochs", note="tasks generate problems: set steps (RL steps = rollouts)"),
    Alias("TRL", "sync_ref_model", convert=_sync_ref_model),
    Alias("TRL", "ref_model_sync_steps", convert=_sync_every),
    Alias("TRL", "ref_model_mixup_alpha", "reset.alpha"),
    Alias("TRL", "output_dir", "run_dir"),
    Alias("TRL", "eval_steps", "eval_every"),
    Alias("TRL", "save_steps", "checkpoint.every"),
    Alias("TRL", "save_total_limit", "checkpoint.keep_last"),
    Alias("TRL", "report_to", convert=_loggers),
    Alias("TRL", "model_name_or_path", convert=_model_path),
    Alias("TRL", "max_prompt_length", note="prompts are never truncated; the task's limits are checked at start"),
    Alias("TRL", "bf16", note="hardware.dtype=bf16 (CUDA autocast; fp32 on CPU)"),
    Alias("TRL", "use_vllm", note="rollouts use the bench's own sampler with a KV cache"),
]

_A, _R, _M = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "actor_rollout_ref.model."
VERL: list[Alias] = [
    Alias("verl", _A + "optim.lr", "algo.lr"),
    Alias("verl", _A + "optim.weight_decay", "algo.weight_decay", note="verl's default is 0.01, the bench's 0.0"),
    Alias("verl", _A + "optim.lr_warmup_steps", convert=_verl_warmup_steps),
    Alias("verl", _A + "optim.lr_warmup_steps_ratio", convert=_steps_from_ratio),
    Alias("verl", _A + "optim.total_training_steps", "steps"),
    Alias("verl", _A + "ppo_mini_batch_size", convert=_minibatches_from_verl),
    Alias("verl", _A + "ppo_micro_batch_size_per_gpu", note="a memory knob with no effect on the update: drop it"),
    Alias("verl", _A + "ppo_epochs", "algo.ppo_epochs"),
    Alias("verl", _A + "clip_ratio", convert=_epsilon(_A + "clip_ratio_high")),
    Alias("verl", _A + "clip_ratio_low", "algo.eps_low"),
    Alias("verl", _A + "clip_ratio_high", "algo.eps_high"),
    Alias("verl", _A + "clip_ratio_c", "algo.clip_ratio_c"),
    Alias("verl", _A + "loss_agg_mode", convert=_map("algo.loss_agg", _LOSS_AGG, "loss_agg_mode")),
    Alias("verl", _A + "entropy_coeff", "algo.entropy_coef"),
    Alias("verl", _A + "grad_clip", "algo.grad_clip"),
    Alias("verl", _A + "use_kl_loss", convert=_use_kl_loss),
    Alias("verl", _A + "kl_loss_coef", convert=_verl_kl_loss_coef),
    Alias("verl", _A + "kl_loss_type", convert=_verl_kl_loss_type),
    Alias("verl", _R + "n", "algo.group_size"),
    Alias("verl", _R + "temperature", "algo.temperature"),
    Alias("verl", _R + "top_p", "algo.top_p"),
    Alias("verl", _R + "top_k", convert=_top_k),
    Alias("verl", _R + "response_length", "algo.max_new_tokens"),
    Alias("verl", _M + "path", convert=_model_path),
    Alias("verl", _M + "lora_rank", convert=_lora_rank),
    Alias("verl", _M + "lora_alpha", "adapter.alpha"),
    Alias("verl", _M + "target_modules", convert=_targets),
    Alias("verl", _M + "custom_chat_template", "task.chat_template"),
    Alias("verl", "data.train_batch_size", "algo.prompts_per_step"),
    Alias("verl", "data.max_response_length", "algo.max_new_tokens"),
    Alias("verl", "data.max_prompt_length", note="prompts are never truncated; the task's limits are checked at start"),
    Alias("verl", "data.train_files", convert=_train_files),
    Alias("verl", "data.val_files", "task.val_path"),
    Alias("verl", "algorithm.adv_estimator", convert=_adv_estimator),
    Alias("verl", "algorithm.norm_adv_by_std_in_grpo", convert=_norm_adv_by_std),
    Alias("verl", "algorithm.use_kl_in_reward", convert=_placement("reward", ["kl_estimator.placement=loss"])),
    Alias("verl", "algorithm.kl_penalty", convert=_verl_kl_penalty),
    Alias("verl", "algorithm.kl_ctrl.kl_coef", convert=_verl_kl_ctrl_coef),
    Alias("verl", "algorithm.kl_ctrl.type", convert=_map("kl_ctl", _KL_CTL, "kl_ctrl.type")),
    Alias("verl", "algorithm.kl_ctrl.target_kl", "kl_ctl.target"),
    Alias("verl", "algorithm.kl_ctrl.horizon", "kl_ctl.horizon"),
    Alias("verl", "algorithm.filter_groups.enable", "algo.dynamic_sampling"),
    Alias("verl", "trainer.total_training_steps", "steps", note="RL steps = rollouts"),
    Alias("verl", "trainer.total_epochs", note="tasks generate problems: set steps (RL steps = rollouts)"),
    Alias("verl", "trainer.test_freq", "eval_every"),
    Alias("verl", "trainer.save_freq", convert=_save_freq),
    Alias("verl", "trainer.val_before_train", "eval.at_start"),
    Alias("verl", "trainer.logger", convert=_loggers),
    Alias("verl", "trainer.project_name", "tracking.wandb_project"),
    Alias("verl", "trainer.default_local_dir", "run_dir"),
    Alias("verl", "trainer.n_gpus_per_node", note="one device per run: hardware=cuda (a sweep spreads runs)"),
]

TABLE: dict[str, Alias] = {a.name: a for a in TRL + VERL}
# last components too generic to stand for one verl key when typed alone
_AMBIGUOUS_LEAVES = {"path", "type", "enable", "n"}


def _leaf_index() -> dict[str, Alias]:
    out: dict[str, Alias] = {}
    for a in TRL + VERL:  # TRL first: a flat name is TRL's where both libraries use it
        leaf = a.name.rsplit(".", 1)[-1]
        if leaf not in _AMBIGUOUS_LEAVES or a.name == leaf:
            out.setdefault(leaf, a)
    out["n"] = TABLE[_R + "n"]  # a bare n= is the rollout count in every RL library
    return out


LEAVES = _leaf_index()


def lookup(key: str, sections: frozenset[str] = frozenset()) -> Alias | None:
    """The entry for ``key`` (no "+"): their full name; their name under one of the bench's
    ``sections`` (``algo.learning_rate``); or, failing both, the last component alone."""
    if key in TABLE:
        return TABLE[key]
    head, _, rest = key.partition(".")
    if rest and head in sections and rest in TABLE:
        return TABLE[rest]
    return LEAVES.get(key.rsplit(".", 1)[-1])


def translate(key: str, value: str, given: Given, sections: frozenset[str] = frozenset()) -> Suggestion | None:
    """The bench's override(s) for one foreign ``key=value`` (or None if the table has no entry).

    ``given``: every ``key=value`` of the same command line (conversions read their companions,
    e.g. ``ppo_mini_batch_size`` reads ``data.train_batch_size``)."""
    alias = lookup(key, sections)
    if alias is None:
        return None
    if alias.convert is not None:
        overrides, note = alias.convert(value, given)
        note = "; ".join(n for n in (note, alias.note) if n)
    elif alias.target is not None:
        overrides, note = [f"{alias.target}={value}"], alias.note
    else:
        overrides, note = [], alias.note
    return Suggestion(alias, overrides, note)

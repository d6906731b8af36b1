"""Every bench key under ``engine=trl``: the ``GRPOConfig`` field (or TRL mechanism) it becomes, or
the reason TRL cannot express it — as data. ``refusals(cfg)`` reads the same rules to refuse a config
before anything runs, and ``docs/engines.md`` is generated from them (``render_table``; a test fails
when the file differs), so the table, the checks and the build cannot drift apart.

A rule covers a key (``algo.lr``) or a whole group (``task.*``). ``refuse(cfg)`` returns the reason
when the configured value cannot be expressed in TRL 1.16 (None when it can). The translation itself
is ``build.grpo_args``; each field it sets is named here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from prorl_bench.config import (
    AdapterKind,
    AdapterReferenceKind,
    Config,
    ConfigError,
    GrowthKind,
    HFImpl,
    KLControlKind,
    KLPlacement,
    LossAgg,
    ModelKind,
    NonFinitePolicy,
)
from prorl_bench.config.options import PARAMS, SECTIONS

TRL_VERSION = "1.16.0"  # the pinned TRL (pyproject extra ``trl``) the rules were read from
# the TRL releases the engine and ReferenceResetCallback are tested on: [first, last] (1.16.0 is also the newest
# release on the package index this was checked against). Outside it the engine refuses (it overrides
# private TRL methods, trainer.py) and the callback warns (it uses TRL's public surface only).
TRL_TESTED = ("1.16.0", "1.16.0")


def trl_version_problem(version: str | None = None) -> str | None:
    """Why the installed TRL (or ``version``) is outside ``TRL_TESTED``; None inside it."""
    from packaging.version import Version

    if version is None:
        import trl

        version = trl.__version__
    lo, hi = TRL_TESTED
    if Version(lo) <= Version(version) <= Version(hi):
        return None
    tested = lo if lo == hi else f"{lo} to {hi}"
    return (f"TRL {version} is installed; prorl-bench's TRL integration is tested on TRL {tested} only "
            f"(pip install 'prorl-bench[trl]' pins trl=={TRL_VERSION})")  # fmt: skip


# bench loss_agg -> TRL loss_type (both normalise per optimizer step over that step's rows)
LOSS_TYPES = {LossAgg.token: "dapo", LossAgg.sequence: "grpo", LossAgg.seq_mean_token_sum_norm: "dr_grpo"}
# bench advantage -> TRL scale_rewards (TRL's advantage is always R - mean_group(R), then scaled)
SCALE_REWARDS = {"grpo": "group", "dr_grpo": "none"}
REFERENCE_ADAPTER = "ref"  # TRL's reference adapter name for a PEFT policy (trainer: use_adapter(model, "ref"))
TRL_ADV_EPS = 1e-4  # TRL divides by (std + 1e-4), hard-coded (grpo_trainer.py)
# where the KL term's anchor log-probs come from on TRL (engines/trl/trainer.py: BenchGRPOTrainer)
REF_SOURCES = ("cached", "recompute", "old")


def ref_source(cfg: Config) -> str:
    """``variant.reference`` (+ ``algo.beta``) -> ``BenchGRPOTrainer``'s ``ref_source``: A0 recomputes
    in every loss computation; B with beta > 0 anchors the KL at pi_old; everything else is TRL's own
    cached pass (B at beta = 0 has no KL term, so nothing differs)."""
    if cfg.variant.reference == "recompute":
        return "recompute"
    if cfg.variant.reference == "none" and cfg.algo.beta > 0:
        return "old"
    return "cached"


@dataclass(frozen=True)
class Rule:
    """``key``: a bench key, or ``group.*``; ``trl``: what it becomes; ``refuse``: the reason a value
    cannot be expressed (None when it can)."""

    key: str
    trl: str
    refuse: Callable[[Config], str | None] | None = None
    when: str = ""  # the refused values, for the table


def _unless(ok: Callable[[Config], bool], why: str) -> Callable[[Config], str | None]:
    return lambda c: None if ok(c) else why


RULES: tuple[Rule, ...] = (
    Rule("engine.name", "`trl` builds `trl.GRPOTrainer` (never a re-implementation)"),
    Rule("engine.gradient_checkpointing", "`gradient_checkpointing` (off: the same work as native)"),
    # ---- the model
    Rule(
        "model.kind",
        "the policy is `AutoModelForCausalLM` of `model.path`",
        _unless(
            lambda c: c.model.kind == ModelKind.hf_causal_lm,
            "TRL trains Hugging Face causal LMs: use model=hf_causal_lm model.path=DIR "
            "(python -m prorl_bench.models.tiny_hf builds a tiny one offline)",
        ),
        "native",
    ),
    Rule("model.path", "`GRPOTrainer(model=...)`: the loaded model (after the bench's warm-up when enabled)"),
    Rule(
        "model.impl",
        "HF's own forward (TRL calls the module)",
        _unless(
            lambda c: c.model.impl != HFImpl.fast,
            "the fast LLaMA forward is the bench's own module; TRL runs the Hugging Face module: model.impl=auto|hf",
        ),
        "fast",
    ),
    Rule("model.dropout", "`disable_dropout=True` when 0 (the bench zeroes dropout too)"),
    Rule("model.d_model", "n/a: native policy only (ignored for HF models by both engines)"),
    Rule("model.n_layers", "n/a: native policy only"),
    Rule("model.n_heads", "n/a: native policy only"),
    Rule("model.max_seq_len", "n/a: native policy only"),
    Rule("model.positions", "n/a: native policy only"),
    # ---- the algorithm
    Rule(
        "algo.advantage",
        "`scale_rewards`: grpo -> `group`, dr_grpo -> `none`",
        lambda c: (
            None
            if c.algo.advantage in SCALE_REWARDS
            else f"TRL's advantage is R - mean_group(R), scaled or not; {c.algo.advantage} is another estimator"
        ),
        "rloo, reinforce_pp_baseline, ...",
    ),
    Rule(
        "algo.adv_eps",
        f"TRL divides by std + {TRL_ADV_EPS:g}, hard-coded",
        _unless(
            lambda c: c.algo.adv_eps == TRL_ADV_EPS or c.algo.advantage == "dr_grpo",
            f"TRL's advantage denominator is std + {TRL_ADV_EPS:g} (not configurable); engine=trl sets "
            f"algo.adv_eps={TRL_ADV_EPS:g} so the config states what runs",
        ),
        f"!= {TRL_ADV_EPS:g}",
    ),
    Rule(
        "algo.prompts_per_step",
        "`per_device_train_batch_size` x `steps_per_generation` x processes = "
        "prompts_per_step x group_size (one generation batch = one RL step)",
    ),
    Rule("algo.group_size", "`num_generations`"),
    Rule("algo.temperature", "`temperature`"),
    Rule("algo.top_k", "`top_k` (0 = off in both)"),
    Rule("algo.top_p", "`top_p`"),
    Rule("algo.max_new_tokens", "`max_completion_length` (null: the task's completion budget)"),
    Rule("algo.eps_low", "`epsilon`"),
    Rule("algo.eps_high", "`epsilon_high`"),
    Rule("algo.ppo_epochs", "`num_iterations`"),
    Rule("algo.minibatches", "`steps_per_generation` (`gradient_accumulation_steps=1`)"),
    Rule(
        "algo.loss_agg",
        "`loss_type`: token -> `dapo`, sequence -> `grpo`, seq_mean_token_sum_norm -> `dr_grpo`",
        lambda c: (
            None if c.algo.loss_agg in LOSS_TYPES else f"TRL has no loss_type for loss_agg={c.algo.loss_agg.value}"
        ),
        "seq_mean_token_sum",
    ),
    Rule(
        "algo.dynamic_sampling",
        "refused when true",
        _unless(
            lambda c: not c.algo.dynamic_sampling, "TRL trains every group of a generation batch (no DAPO group filter)"
        ),
        "true",
    ),
    Rule("algo.entropy_coef", "`entropy_coef`"),
    Rule("algo.beta", "`beta` (0: no reference model is loaded)"),
    Rule("algo.lr", "`learning_rate`, `lr_scheduler_type=constant`"),
    Rule("algo.weight_decay", "`weight_decay`"),
    Rule("algo.adam_beta1", "`adam_beta1`"),
    Rule("algo.adam_beta2", "`adam_beta2`"),
    Rule("algo.adam_eps", "`adam_epsilon`"),
    Rule("algo.adamw_impl", "`optim`: auto/foreach -> `adamw_torch`, fused -> `adamw_torch_fused`"),
    Rule("algo.grad_clip", "`max_grad_norm`"),
    Rule("algo.lr_warmup_steps", "the bench's `LRSchedule` (per RL step) multiplied into TRL's LambdaLR"),
    Rule(
        "algo.clip_ratio_c",
        "refused unless null",
        _unless(
            lambda c: c.algo.clip_ratio_c is None,
            "TRL has no dual-clip (its `delta` caps the ratio on both signs of A; another objective)",
        ),
        "non-null",
    ),
    # ---- variants and the KL term
    Rule(
        "variant.name",
        "A0: `BenchGRPOTrainer` recomputes the reference log-probs in every loss computation (minibatch x "
        "PPO epoch) instead of once per generation batch; A1: TRL's default; B: no reference model (TRL's "
        "`beta=0`), the KL term anchored at pi_old (TRL's `old_per_token_logps`) when beta > 0; "
        "C: A1 + `ReferenceResetCallback`",
        lambda c: _variant_refusal(c),
        "A2; A0/A1/C with beta = 0",
    ),
    Rule("variant.reference", "recompute (A0), cached (A1/C) or none (B) (`engines/trl/trainer.py`)"),
    Rule("variant.resets", "`ReferenceResetCallback` (the bench's triggers and optimizer transforms)"),
    Rule(
        "kl_estimator.name",
        "k3 in the loss: TRL's `per_token_kl`; `kl_estimator.importance_weight` is TRL's `use_bias_correction_kl` "
        "(false here by default, true in TRL 1.16: the term multiplied by the ratio pi_theta / pi_old)",
        lambda c: (
            None
            if c.kl_estimator.name == "k3"
            else f"TRL's KL term is k3 only ({c.kl_estimator.name} is not expressible)"
        ),
        "k1, k2",
    ),
    Rule(
        "kl_estimator.placement",
        "loss (TRL adds beta * KL to the per-token loss)",
        _unless(
            lambda c: c.kl_estimator.placement == KLPlacement.loss,
            "TRL puts the KL in the loss; it has no KL-in-reward placement",
        ),
        "reward",
    ),
    Rule(
        "kl_estimator.importance_weight",
        "TRL's `use_bias_correction_kl` (k3's only parameter; k2 and its k2_mode are refused with k2)",
    ),
    Rule("kl_estimator.k2_mode", "n/a (kl_estimator=k2 is refused)"),
    Rule("kl_estimator.log_ratio_clamp", "not applied: TRL clamps no log-ratio (equal while |log-ratio| < 20)"),
    Rule("kl_estimator.kl_clamp", "not applied: TRL does not clamp k3 (equal while k3 < 10 per token)"),
    Rule(
        "kl_ctl.kind",
        "fixed: `beta`",
        _unless(lambda c: c.kl_ctl.kind == KLControlKind.fixed, "TRL's beta is a constant (no adaptive controller)"),
        "adaptive",
    ),
    Rule("kl_ctl.*", "n/a (fixed beta)"),
    # ---- resets and optimizer state: the bench's own semantics, applied to TRL's trainer
    Rule(
        "reset.source",
        "current: `ReferenceResetCallback` copies the policy",
        _unless(
            lambda c: c.reset.source.value == "current",
            "not wired for engine=trl: the callback resets TRL's reference from the live policy and keeps no "
            "snapshot of the best held-out policy (use engine=native for reset.source=best)",
        ),
        "best",
    ),
    Rule(
        "reset.*",
        "`ReferenceResetCallback`: the same trigger registry (periodic, kl_spike, stall, polyak); "
        "kl_spike reads `kl/ref`, measured as native measures it (`run/kl_measure.reference_kl`)",
    ),
    Rule(
        "opt_reset.*",
        "`ReferenceResetCallback`: the bench's transforms on TRL's AdamW state; LR re-warm-up "
        "multiplied into TRL's LambdaLR",
    ),
    # ---- adapters and growth
    Rule(
        "adapter.kind",
        "lora -> PEFT `LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets)`",
        lambda c: (
            None
            if c.adapter.kind in (AdapterKind.none, AdapterKind.lora)
            else "TRL trains one PEFT adapter (no dual adapters / gradient routing)"
        ),
        "dual_lora",
    ),
    Rule("adapter.rank", "`LoraConfig.r`"),
    Rule("adapter.alpha", "`LoraConfig.lora_alpha`"),
    Rule("adapter.targets", "`LoraConfig.target_modules` (HF names: q_proj, ...)"),
    Rule(
        "adapter.freeze_base",
        "PEFT freezes the base",
        _unless(
            lambda c: c.adapter.kind != AdapterKind.lora or c.adapter.params.freeze_base,
            "PEFT trains the adapters only",
        ),
        "false with lora",
    ),
    Rule(
        "adapter.reference",
        "the base with adapters disabled; after a reset a frozen `ref` adapter",
        _unless(
            lambda c: c.adapter.kind != AdapterKind.lora or c.adapter.params.reference != AdapterReferenceKind.copy,
            "TRL's PEFT reference is the shared base (adapters disabled or the `ref` adapter), never a copy",
        ),
        "copy with lora",
    ),
    Rule("adapter.retain_rank", "n/a (dual_lora is refused)"),
    Rule("adapter.forget_rank", "n/a (dual_lora is refused)"),
    Rule(
        "growth.kind",
        "refused unless none",
        _unless(
            lambda c: c.growth.kind == GrowthKind.none,
            "PEFT cannot grow a LoRA rank (peft#825) and TRL's optimizer is built once",
        ),
        "rank",
    ),
    Rule("growth.*", "n/a (growth=none)"),
    Rule(
        "detector.name",
        "refused unless none",
        _unless(lambda c: c.detector.name == "none", "TRL has no gradient routing (detector labels)"),
        "any",
    ),
    Rule("detector.*", "n/a (detector=none)"),
    Rule("route.*", "n/a (detector=none)"),
    # ---- hardware
    Rule("hardware.device", "`use_cpu` on cpu; `accelerate launch` places processes on GPUs"),
    Rule("hardware.dtype", "`bf16` (autocast on CUDA, as native)"),
    Rule("hardware.tf32", "`tf32`"),
    Rule("hardware.deterministic", "the bench's `torch.use_deterministic_algorithms`, set before TRL starts"),
    Rule("hardware.torch_threads", "the bench pins torch threads before TRL starts"),
    Rule("hardware.peak_flops", "n/a (TRL reports no FLOPs)"),
    Rule("hardware.decode", "the bench's held-out evaluation only (TRL's generate for training)"),
    Rule(
        "hardware.update_norm",
        "where the snapshot for `update_norm` lives (the bench's `ParamSnapshot`, taken before the RL step's "
        "first optimizer step)",
    ),
    Rule("hardware.logits_mb", "the bench's held-out evaluation only"),
    # ---- the bench around TRL: data, evaluation, records
    Rule(
        "task.*",
        "a `datasets.Dataset` of the task's prompts in the bench's order (`shuffle_dataset=False`); "
        "the bench's verifier is the reward function",
    ),
    Rule("warmup.*", "the bench's cached supervised warm-up, before TRL starts (when enabled)"),
    Rule("eval.*", "the bench's held-out evaluation (pass@k, samples.jsonl) every eval_every RL steps"),
    Rule("eval_every", "the bench's held-out evaluation (a callback at the RL-step boundary)"),
    Rule("steps", "`max_steps` = steps x minibatches x ppo_epochs (optimizer steps)"),
    Rule("seed", "`seed` and `data_seed`; the prompt stream is the bench's for this seed"),
    Rule("checkpoint.every", "`save_steps` (RL steps x optimizer steps per RL step) + the bench's state"),
    Rule("checkpoint.keep_last", "`save_total_limit`"),
    Rule(
        "guard.nonfinite",
        "fail: a non-finite loss or grad norm stops the run",
        _unless(lambda c: c.guard.nonfinite == NonFinitePolicy.fail, "TRL cannot skip a batch from outside its step"),
        "skip_batch",
    ),
    Rule("tracking.*", "the bench's writers (metrics.jsonl + TensorBoard / W&B); TRL `report_to=none`"),
    Rule(
        "export.at_end",
        "refused when true",
        _unless(
            lambda c: not c.export.at_end,
            "not wired for engine=trl: save the model from the run's TRL checkpoint (run_dir/trl/checkpoint-N)",
        ),
        "true",
    ),
    Rule("progress", "`disable_tqdm=not progress`"),
    Rule("run_dir", "`output_dir` = run_dir/trl (TRL's checkpoints); the bench's files in run_dir"),
    Rule("study.*", "the bench's (studies, seed blocks)"),
    Rule("plugins", "the bench's (registered options)"),
)


def _variant_refusal(c: Config) -> str | None:
    v = c.variant
    if v.reference == "buffered":
        return f"variant={v.name}: TRL has no preallocated reference buffer (its behaviour is A1)"
    if v.reference not in ("cached", "recompute", "none"):
        return f"variant.reference={v.reference}: TRL knows a frozen reference (cached / recompute) or none"
    if v.reference != "none" and c.algo.beta == 0:
        return (f"variant={v.name} with algo.beta=0: TRL loads no reference model at beta=0; use variant=B "
                "(or beta > 0)")  # fmt: skip
    return None


def leaf_keys(obj: Any = None, prefix: str = "") -> list[str]:
    """Every key a config may set (``algo.lr``, ``task.min_len``, ``seed``): the schema's leaves, and in each
    option section every registered option's parameters as the flat keys a user types (``reset.every``,
    ``adapter.rank``), whichever option the schema's default selects."""
    obj = Config() if obj is None else obj
    out = []
    for f in fields(obj):
        val = getattr(obj, f.name)
        if f.name == PARAMS and prefix.rstrip(".") in SECTIONS:
            reg = SECTIONS[prefix.rstrip(".")]
            keys = {p.name for n in reg.names() if (cls := reg.params_class(n)) is not None for p in fields(cls)}
            out += [f"{prefix}{k}" for k in sorted(keys)]
        else:
            out += leaf_keys(val, f"{prefix}{f.name}.") if is_dataclass(val) else [f"{prefix}{f.name}"]
    return out


def rule_for(key: str) -> Rule | None:
    """The rule covering ``key``: its own, else its group's ``group.*`` (nearest group first)."""
    exact = {r.key: r for r in RULES}
    if key in exact:
        return exact[key]
    parts = key.split(".")
    for n in range(len(parts) - 1, 0, -1):
        rule = exact.get(".".join(parts[:n]) + ".*")
        if rule is not None:
            return rule
    return None


def refusals(cfg: Config) -> list[tuple[str, str]]:
    """(key, reason) for every configured value engine=trl cannot express (empty: it can run)."""
    out = []
    for rule in RULES:
        why = rule.refuse(cfg) if rule.refuse is not None else None
        if why is not None:
            out.append((rule.key, why))
    return out


def refuse_for_trl(cfg: Config) -> None:
    """engine=trl: a ConfigError naming every key TRL cannot express, before any directory or model
    exists (the TRL engine's ``check``: runs wherever a config is validated — the CLI's preflight, the
    sweep's up-front check — once ``prorl_bench.engines`` is imported)."""
    if cfg.engine.name != "trl":
        return
    found = refusals(cfg)
    if found:
        lines = "; ".join(f"{key}: {why}" for key, why in found)
        raise ConfigError(f"engine=trl cannot run this config (docs/engines.md): {lines}")
    try:
        import trl  # noqa: F401
    except ImportError:
        raise ConfigError(f"engine=trl needs TRL: pip install 'prorl-bench[trl]' (pins trl=={TRL_VERSION})") from None
    why = trl_version_problem()
    if why is not None:  # the engine overrides private TRL methods (trainer.py): another release may change them
        raise ConfigError(f"engine=trl: {why}")


def render_table() -> str:
    """docs/engines.md's mapping table, generated from ``RULES`` (one row per rule)."""
    rows = ["| bench key | under engine=trl | refused when |", "|---|---|---|"]
    for r in RULES:
        when = r.when if r.refuse is not None else ""
        rows.append(f"| `{r.key}` | {r.trl} | {when} |")
    return "\n".join(rows) + "\n"


BEGIN, END = "<!-- BEGIN generated: python -m prorl_bench.engines.trl.config_map -->", "<!-- END generated -->"


def update_doc(path: Any) -> bool:
    """Rewrite the generated table of ``path`` (docs/engines.md) between its markers; True if it changed."""
    from pathlib import Path

    p = Path(path)
    text = p.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{render_table()}{END}{tail}"
    if new != text:
        p.write_text(new)
    return new != text


if __name__ == "__main__":  # regenerate docs/engines.md's table from the rules
    from prorl_bench.searchpath import ROOT

    print("docs/engines.md", "updated" if update_doc(ROOT / "docs" / "engines.md") else "unchanged")

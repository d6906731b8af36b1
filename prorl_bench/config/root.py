"""The root schema ``Config`` (every group), its cross-group checks, the Hydra registration
(``register_configs``) and ``to_config``, which validates a composed config."""

from __future__ import annotations

import math
import warnings
from dataclasses import MISSING as MISSING_FIELD
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from prorl_bench import registry
from prorl_bench.config.algo import AlgoConfig, KLConfig, KLControlConfig, VariantConfig
from prorl_bench.config.engine import EngineConfig
from prorl_bench.config.enums import AdapterKind, GrowthKind, KLControlKind, KLPlacement, ModelKind, PromptStyle
from prorl_bench.config.events import GrowthConfig, OptResetConfig, ResetConfig
from prorl_bench.config.model import AdapterConfig, HardwareConfig, ModelConfig, WarmupConfig
from prorl_bench.config.options import PARAMS, SECTIONS, UNSET, flat_params, split_section
from prorl_bench.config.routing import DetectorConfig, RouteAdvantages, RouteConfig, RouteUse
from prorl_bench.config.run import CheckpointConfig, EvalConfig, ExportConfig, GuardConfig, TrackingConfig
from prorl_bench.config.study import StudyConfig
from prorl_bench.config.task import TaskConfig
from prorl_bench.registry import ConfigError
from prorl_bench.searchpath import CONF_DIR, register_resolvers

_require = registry.require  # ConfigError "invalid config value key=value: allowed ..." unless ok


@dataclass
class Config:
    task: TaskConfig = field(default_factory=TaskConfig)
    variant: VariantConfig = field(default_factory=VariantConfig)
    kl_estimator: KLConfig = field(default_factory=KLConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    reset: ResetConfig = field(default_factory=ResetConfig)
    opt_reset: OptResetConfig = field(default_factory=OptResetConfig)
    kl_ctl: KLControlConfig = field(default_factory=KLControlConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    growth: GrowthConfig = field(default_factory=GrowthConfig)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    route: RouteConfig = field(default_factory=RouteConfig)  # what the detector's labels do (routing.py)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)  # native | trl: which trainer runs (docs/engines.md)
    seed: int = 0  # run seed: prompts, sampling, minibatch order, initial weights (< 2**24)
    # schema default (Python API); a composed run takes its regime's (conf/regime/v2.yaml: 300)
    steps: int = 150  # RL steps = rollouts (not optimizer steps)
    eval_every: int = 25  # validation on the held-out split every N steps (and at the end)
    progress: bool = True  # terminal progress bar (single runs only)
    run_dir: str | None = None  # None: Hydra's output directory
    export: ExportConfig = field(default_factory=ExportConfig)
    study: StudyConfig = field(default_factory=StudyConfig)  # a study grid's question and seed blocks (docs/studies.md)
    # modules imported before validation that register options (docs/extending.md): plugins=[my_pkg.my_options]
    plugins: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _reject_nonfinite(self)
        self.study.check_seed(self.seed)  # a confirm-block run on explore seeds would be mislabelled
        _require(self.steps >= 1, "steps", self.steps, ">= 1")
        _require(self.eval_every >= 1, "eval_every", self.eval_every, ">= 1")
        # derived generators multiply the seed (evaluation: seed * 1_000_003 + step; rank growth:
        # (seed * 1_000_003 + step) * 100_003 + layer), which must stay inside torch's 64-bit seeds
        _require(0 <= self.seed < MAX_SEED, "seed", self.seed, f"in [0, {MAX_SEED}) (2**24)")
        placement = self.kl_estimator.placement
        v = self.variant
        _require(
            not (placement == KLPlacement.reward and not registry.REFERENCES.meta(v.reference)["per_rollout"]),
            "kl_estimator.placement",
            placement.value,
            f"'loss' with variant {v.name} (reference={v.reference}: A0 recomputes reference logprobs for a "
            "loss term; B has no reference model to fold into the reward)",
        )
        _require(
            self.reset.trigger == "none" or (v.resets and registry.REFERENCES.meta(v.reference)["model"]),
            "reset",
            self.reset.trigger,
            f"'none' with variant {v.name} (reference resets are variant C: variant.resets=true)",
        )
        _require(
            not (self.kl_ctl.kind == KLControlKind.adaptive and self.algo.beta == 0),
            "algo.beta",
            self.algo.beta,
            "> 0 with kl_ctl=adaptive (a multiplicative controller cannot move beta from 0)",
        )
        if self.growth.kind != GrowthKind.none:
            _require(
                self.adapter.kind == AdapterKind.lora,
                "adapter",
                self.adapter.kind.value,
                "'lora' with growth=rank (growth grows the adapter rank)",
            )
            _require(
                self.growth.params.max_rank > self.adapter.params.rank,
                "growth.max_rank",
                self.growth.params.max_rank,
                f"> adapter.rank ({self.adapter.params.rank})",
            )
        _check_routing(self)
        registry.run_config_checks(self)  # cross-group checks and warnings the options' modules register
        _check_task_and_model(self)


def _check_task_and_model(cfg: Config) -> None:
    """The task fits the model: chat templates and program-writing tasks need an HF tokenizer, and a
    native model's context holds the longest prompt and completion (with ``positions=answer``, twice)."""
    if cfg.task.name == "reasoning_gym":
        _require(
            cfg.task.params.prompt_style != PromptStyle.chat or cfg.model.kind != ModelKind.native,
            "task.prompt_style",
            "chat",
            "compact or question with the native character-level policy (chat templates are an HF "
            "tokenizer's: use model=hf_causal_lm)",
        )
    _require(
        cfg.task.chat_template is None or cfg.model.kind != ModelKind.native,
        "task.chat_template",
        cfg.task.chat_template,
        "null with the native character-level policy (chat templates are an HF tokenizer's: model=hf_causal_lm)",
    )
    _require(
        not (registry.TASKS.meta(cfg.task.name).get("needs_hf", False) and cfg.model.kind == ModelKind.native),
        "task",
        cfg.task.name,
        "a task for model=hf_causal_lm: its prompts go through a chat template",
    )
    _require(
        not (cfg.task.name == "code" and cfg.model.kind == ModelKind.native),
        "task",
        "code",
        "a task the model can write programs for: task=code needs model=hf_causal_lm (the character-level "
        "policy has no programming vocabulary or context for it)",
    )
    if cfg.model.kind != ModelKind.native:
        return  # an HF model's context length is checked against its own config when loaded
    max_prompt, max_completion = _task_lengths(cfg.task, cfg.algo.max_new_tokens)
    _require(
        max_prompt + max_completion + 1 <= cfg.model.max_seq_len,
        "model.max_seq_len",
        cfg.model.max_seq_len,
        f">= {max_prompt + max_completion + 1} for task {cfg.task.name} with max_len={cfg.task.max_len}",
    )
    if cfg.model.positions == "answer":  # half the positions for the prompt (with BOS), half for the answer
        need = 2 * max(max_prompt + 1, max_completion)
        _require(
            need <= cfg.model.max_seq_len,
            "model.max_seq_len",
            cfg.model.max_seq_len,
            f">= {need} with model.positions=answer (prompts and completions get half the positions each)",
        )


MAX_SEED = 2**24


def _reject_nonfinite(obj: Any, prefix: str = "") -> None:
    """No float anywhere in the config may be NaN or infinite (an option's parameters included: flat keys)."""
    for f in fields(obj):
        val = getattr(obj, f.name)
        if is_dataclass(val):
            _reject_nonfinite(val, prefix if f.name == PARAMS else f"{prefix}{f.name}.")
        elif isinstance(val, float):
            _require(math.isfinite(val), f"{prefix}{f.name}", val, "a finite number")


def _task_lengths(task: TaskConfig, max_new_tokens: int | None = None) -> tuple[int, int]:
    """(longest prompt, completion budget) in tokens: what the task declares (``lengths``), else (a
    plugin's factory that declares none) the task built from its code."""
    lengths = registry.TASKS.hook(task.name, "lengths")
    max_prompt, max_completion = lengths(task) if lengths is not None else _built_lengths(task)
    return max_prompt, max_new_tokens or max_completion


def _built_lengths(task: TaskConfig) -> tuple[int, int]:
    t = registry.build_task(task)
    return t.max_prompt_len, t.max_completion_len


def _check_routing(cfg: Config) -> None:
    """The detector / route / adapter combinations a routing study may use (docs/routing.md)."""
    use, dual = cfg.route.use, cfg.adapter.kind == AdapterKind.dual_lora
    _require(
        cfg.detector.name != "none" or cfg.route == RouteConfig(),
        "route",
        f"use={use.value},advantages={cfg.route.advantages.value}",
        "the defaults without a detector (detector=none: there are no labels to use)",
    )
    _require(
        cfg.detector.name == "none" or use != RouteUse.route or dual,
        "detector",
        cfg.detector.name,
        "'none' unless adapter=dual_lora (labels route gradients between the retain and forget adapters), "
        "or route.use=filter|penalize|observe",
    )
    _require(
        not (dual and use != RouteUse.route),
        "route.use",
        use.value,
        "'route' with adapter=dual_lora (the filter, penalize and observe baselines train one adapter: adapter=lora)",
    )
    if cfg.route.advantages == RouteAdvantages.split:
        _require(
            registry.ADVANTAGES.meta(cfg.algo.advantage).get("centres_per_group", True),
            "algo.advantage",
            cfg.algo.advantage,
            "a group-local estimator (grpo, rloo, dr_grpo) with route.advantages=split (it normalises "
            "within subsets of each group; a batch-whitened estimator has no per-group form)",
        )


def register_configs() -> None:
    """Register the schema so ``conf/config.yaml`` can list ``base_config`` first in its defaults.
    (``prorl-bench --help``'s key list is ``confhelp.register_help``'s, called by the CLI.)"""
    register_resolvers()  # ${prorl_bench_sweeps:} in hydra.searchpath (conf/config.yaml)
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=hydra_node())


def hydra_node() -> dict[str, Any]:
    """The schema's defaults as the untyped node Hydra composes onto. An axis's section holds its own
    keys and, for every built-in option's parameter, the key with no value (``???``: not given): so a
    command line may set one for a job that may not select its option (``reset=none,periodic
    reset.every=25``) and Hydra still has a key to override, while the value a run uses is the
    *selected* option's own default (``to_config`` drops keys left unset; ``complete`` records what the
    run uses). No option's default is written here: another option's never reaches a run."""
    node = OmegaConf.to_container(OmegaConf.structured(Config), enum_to_str=True)
    for section, reg in SECTIONS.items():
        node[section].pop(PARAMS, None)
        for name in reg.names():
            cls = reg.params_class(name)
            for f in fields(cls) if cls is not None else ():
                node[section].setdefault(f.name, UNSET)
    return node


def split_options(cfg: DictConfig) -> DictConfig:
    """A resolved copy of the composed ``cfg`` with every axis's flat option keys moved into its
    section's ``params``, and without the named grid's own top-level keys (``GRID_KEYS``)."""
    try:
        node = OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # an interpolation that does not resolve
        raise ConfigError(str(e).replace("\n", "; ")) from e
    for key in GRID_KEYS:
        node.pop(key, None)
    schema = Config()
    for section, reg in SECTIONS.items():
        if isinstance(node.get(section), dict):
            node[section] = split_section(node[section], section, type(getattr(schema, section)))
            _keep_selected(node[section], reg)
    return OmegaConf.create(node)


def _keep_selected(section: dict[str, Any], reg: registry.Registry) -> None:
    """Drop from ``section``'s parameters the keys of the axis's *other* options (the base carries the
    built-ins' defaults; ``reset=none reset.every=25`` is accepted and has no effect, as before). A key
    no option of the axis has stays, and is reported as unknown."""
    name = section.get(reg.selector)
    if name not in reg:
        return
    cls = reg.params_class(name)
    own = {f.name for f in fields(cls)} if cls is not None else set()
    owners: dict[str, list[str]] = {}  # another option's parameter -> the options that take it
    defaults: dict[str, list[Any]] = {}
    for n in reg.names():
        for f in fields(c) if (c := reg.params_class(n)) is not None else ():
            if f.name not in own:
                owners.setdefault(f.name, []).append(n)
                if f.default is not MISSING_FIELD:
                    defaults.setdefault(f.name, []).append(getattr(f.default, "value", f.default))
    # a value no option has as its default was set by the command line or a config file: it does nothing here
    unused = {k: v for k, v in section[PARAMS].items() if k in owners and v not in defaults.get(k, [])}
    if unused:
        keys = ", ".join(f"{reg.section}.{k}={v}" for k, v in unused.items())
        takes = "; ".join(f"{reg.section}.{k} is a parameter of {', '.join(owners[k])}" for k in unused)
        owner = owners[next(iter(unused))][0]
        select = (
            f"{reg.section}={owner}" if (CONF_DIR / reg.section / f"{owner}.yaml").is_file() else f"{reg.key}={owner}"
        )
        warnings.warn(
            f"{keys} has no effect: {reg.section}.{reg.selector}={name} ({takes}; select it: {select})",
            UnusedOptionKeyWarning,
            stacklevel=2,
        )
    section[PARAMS] = {k: v for k, v in section[PARAMS].items() if k not in owners}


def as_dict(conf: Config) -> dict[str, Any]:
    """``dataclasses.asdict(conf)`` with each option's parameters as flat keys of its section, as the
    composed config holds them (what checkpoints store and ``to_config`` reads back)."""
    out = asdict(conf)
    for section in SECTIONS:
        out[section].pop(PARAMS, None)
        out[section].update(flat_params(getattr(conf, section)))
    return out


class UnusedOptionKeyWarning(UserWarning):
    """A parameter of an option the config does not select (``reset=none reset.every=2``)."""


# Keys a named grid adds at the top level through `+group=option` (content packaged _global_).
# stratum_beta / arm_beta: a stratified grid's beta and an arm's own (sweeps/sweep/prolonged.yaml sets
# algo.beta: ${oc.select:arm_beta,${stratum_beta}})
GRID_KEYS = {"sweep", "arm", "kl_setup", "stratum_beta", "arm_beta"}

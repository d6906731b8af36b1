"""``to_config``: a composed config validated into the typed ``Config`` — unknown keys (with the closest
names, and the bench's name for a TRL / verl one), each option's flat parameters, every group's checks —
and ``complete``: the composed config as a run records it."""

from __future__ import annotations

import difflib
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from prorl_bench import registry
from prorl_bench.config.aliases import translate
from prorl_bench.config.options import PARAMS, SECTIONS, common_keys, flat_params
from prorl_bench.config.root import GRID_KEYS, Config, split_options
from prorl_bench.registry import ConfigError


def _unknown_keys(node: Any, schema: Any, prefix: str = "") -> list[str]:
    """Keys of the composed config that the dataclass schema does not have (free-form dicts skipped)."""
    if not is_dataclass(schema) or not isinstance(node, DictConfig):
        return []
    names = {f.name for f in fields(schema)}
    bad = []
    for key in node.keys():
        path = f"{prefix}{key}"
        if key not in names:
            if not (prefix == "" and key in GRID_KEYS):
                bad.append(path)
            continue
        if key == PARAMS:
            continue  # an option's parameters: checked against the *selected* option (_unknown_params), not
            # the schema default's option (k3's K3Params would call k2's k2_mode unknown)
        bad += _unknown_keys(node._get_node(key), getattr(schema, key), f"{path}.")
    return bad


def _suggest(path: str, value: Any = None) -> str:
    hint = translate(path, str(value), {}, frozenset(f.name for f in fields(Config)))
    if hint is not None:
        return "; " + hint.message(path).split(": ", 1)[-1]
    leaf = path.rsplit(".", 1)[-1]
    parent = path.rsplit(".", 1)[0] if "." in path else ""
    schema: Any = Config()
    for part in [p for p in parent.split(".") if p]:
        schema = getattr(schema, part, None)
    if is_dataclass(schema):
        names = [n for n in [f.name for f in fields(schema) if f.name != PARAMS] + _option_keys(parent) if n != leaf]
        close = difflib.get_close_matches(leaf, names, n=3, cutoff=0.6)
        if close:
            return "; did you mean " + " or ".join(f"{parent + '.' if parent else ''}{c}" for c in close) + "?"
    return ""


def _takes(split: DictConfig, key: str) -> str:
    """`` (reset trigger 'periodic' takes reset.every)`` for a key of an option section."""
    section = key.split(".", 1)[0]
    reg = SECTIONS.get(section)
    name = None if reg is None else OmegaConf.select(split, f"{section}.{reg.selector}")
    if reg is None or name not in reg:
        return ""
    cls = reg.params_class(name)
    takes = ", ".join(f"{section}.{f.name}" for f in fields(cls)) if cls is not None else "no parameters"
    return f" ({reg.what} {name!r} takes {takes})"


def _option_keys(section: str) -> list[str]:
    """The parameter keys of every registered option of the axis whose section is ``section``."""
    reg = SECTIONS.get(section)
    if reg is None:
        return []
    return sorted({f.name for n in reg.names() if (cls := reg.params_class(n)) for f in fields(cls)})


def _unknown_params(cfg: DictConfig) -> list[str]:
    """Flat keys of each option section that are neither the section's own nor the selected option's."""
    bad = []
    for section, reg in SECTIONS.items():
        name = OmegaConf.select(cfg, f"{section}.{reg.selector}")
        if name not in reg:
            continue  # the section reports an unknown option itself, with the allowed names
        cls = reg.params_class(name)
        allowed = {f.name for f in fields(cls)} if cls is not None else set()
        bad += [f"{section}.{k}" for k in cfg[section].get(PARAMS, {}) if k not in allowed]
    return bad


def _schema() -> DictConfig:
    """The structured schema with every option section's ``params`` untyped: the default option's
    parameter class (k3's ``K3Params``) must not type the parameters of the option a config selects
    (k2's ``k2_mode``); those are checked against the selected option by each section."""
    base = OmegaConf.structured(Config)
    for section in SECTIONS:
        base[section][PARAMS] = None
    return base


def to_config(cfg: DictConfig) -> Config:
    """Validate a composed config and return typed dataclasses (raises ConfigError).

    Unknown keys are an error however they arrive: Hydra lets ``+algo.learning_rate=1e-5`` add a key
    the schema does not have, and ``OmegaConf.to_object`` would then drop it silently — the run would
    train with the default and record the override as applied.
    """
    registry.load_plugins(cfg.get("plugins") or [])  # their options must exist before validation
    split = split_options(cfg)  # flat option keys -> section.params (checked by each section)
    unknown = list(dict.fromkeys(_unknown_keys(split, Config()) + _unknown_params(split)))
    if unknown:
        raise ConfigError(
            "unknown config key"
            + ("s " if len(unknown) > 1 else " ")
            + ", ".join(f"{k}{_suggest(k, OmegaConf.select(cfg, k))}{_takes(split, k)}" for k in unknown)
            + " (see `prorl-bench --cfg job` for every key)"
        )
    try:
        obj = OmegaConf.to_object(OmegaConf.merge(_schema(), split))
    except ConfigError:
        raise
    except Exception as e:  # OmegaConf validation (type, enum, missing key)
        raise ConfigError(str(e)) from e
    if not isinstance(obj, Config):
        raise ConfigError(f"composed config is {type(obj).__name__}, expected Config")
    return obj


def complete(cfg: DictConfig) -> DictConfig:
    """The composed ``cfg`` with each axis's section holding exactly its own keys and the selected
    option's parameters, defaults filled in (what a run records as ``config_resolved.yaml``).
    ConfigError for an unknown or invalid key, as ``to_config``."""
    conf = to_config(cfg)
    node = OmegaConf.to_container(cfg, resolve=False)
    for section in SECTIONS:
        own = common_keys(type(getattr(conf, section)))
        node[section] = {k: v for k, v in node[section].items() if k in own} | flat_params(getattr(conf, section))
    return OmegaConf.create(node)

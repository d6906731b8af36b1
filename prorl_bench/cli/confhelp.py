"""Help text for every config key, read from the schema's own comments (one place for each fact).

Each field of the dataclasses in ``prorl_bench/config/`` carries a comment — on its line, or on the
comment lines just above it. ``field_help()`` collects them by walking the schema; ``prorl-bench --help``
prints them (``hydra.help.template`` in conf/config.yaml calls the ``prorl_bench_help`` resolver),
and a test fails if a field has none.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import textwrap
import tokenize
import warnings
from typing import Any

from omegaconf import OmegaConf

from prorl_bench import config as config_module
from prorl_bench import registry
from prorl_bench.config import ConfigError
from prorl_bench.config.options import PARAMS, SECTIONS


def _class_comments(cls: type) -> dict[str, str]:
    """field name -> its comment (same-line comment, else the comment block right above it)."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    for i, line in enumerate(lines, start=1):
        stripped = line.strip()
        name = stripped.split(":", 1)[0].strip()
        if name not in names or not line.startswith("    ") or line.startswith("     "):
            continue
        text = comments.get(i)
        if text is None:  # the comment block directly above
            block, j = [], i - 1
            while j in comments and lines[j - 1].strip().startswith("#"):
                block.insert(0, comments[j])
                j -= 1
            text = " ".join(block) if block else None
        if text:
            out[name] = text
    return out


def field_help(schema: type = config_module.Config, prefix: str = "") -> dict[str, tuple[Any, str | None]]:
    """Every leaf key of the schema -> (schema default, help text or None); an option section's
    ``params`` (the selected option's flat keys) is not a key."""
    out: dict[str, tuple[Any, str | None]] = {}
    comments = _class_comments(schema)
    defaults = schema()
    for f in dataclasses.fields(schema):
        if f.name == PARAMS and prefix.rstrip(".") in SECTIONS:
            continue
        value = getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            out.update(field_help(type(value), f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = (value, comments.get(f.name))
    return out


def _fmt(value: Any) -> str:
    value = getattr(value, "value", value)
    return "null" if value is None else str(value)


def _comments(cls: type) -> dict[str, str]:
    """Field comments of ``cls``, or none when its source cannot be read (a class built at run time)."""
    try:
        return _class_comments(cls)
    except (OSError, TypeError):
        return {}


def option_help(reg: registry.Registry, name: str) -> list[str]:
    """``name`` of axis ``reg`` with its one-line description (declared, or its docstring's first
    paragraph), then each parameter (flat key of the section), its default and its comment."""
    text = reg.description(name)
    rows = [f"  {name}" + (f"  # {text}" if text else "")]
    cls = reg.params_class(name)
    if cls is not None:
        notes = _comments(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else "(required)"
            if f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            if default == "???":  # OmegaConf's MISSING: no default
                default = "(required)"
            rows.append(
                f"      {reg.section}.{f.name} = {_fmt(default)}" + (f"  # {notes[f.name]}" if f.name in notes else "")
            )
    return rows


def options_text() -> str:
    """Every registered option of every axis (plugins named on the line included), with its parameters."""
    rows = []
    for reg in registry.AXES:
        rows.append(f"\n{reg.key} ({reg.what}; its parameters are flat keys of {reg.section}):")
        for name in reg.names():
            rows += option_help(reg, name)
    return "\n".join(rows).lstrip("\n")


def _effective(root: Any) -> tuple[Any, str | None]:
    """The composed config of this command line (regime and overrides applied), each option's section
    completed with its parameters; (None, the error) when it does not validate."""
    from prorl_bench.cli.option_code import load_option_code

    load_option_code()  # validated as the run validates it
    node = OmegaConf.to_container(root, resolve=False)
    node.pop("hydra", None)
    cfg = OmegaConf.create(node)
    try:
        registry.load_plugins(cfg.get("plugins") or [])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return config_module.complete(cfg), None
    except ConfigError as e:
        return None, str(e)


def help_text(*, _root_: Any = None) -> str:
    """Every key with the value this command line's run would use (the composed config: the regime's
    and the overrides' values, not the schema's), grouped by section; each option section also lists
    the selected option's parameters; then every registered option of every axis."""
    effective, error = (None, None) if _root_ is None else _effective(_root_)
    rows, section = [], None
    if error:
        rows.append(f"(this command line's config does not validate: {error}; schema defaults shown)")
    keys = field_help()
    extra: dict[str, list[str]] = {}
    if effective is not None:
        for sec, reg in SECTIONS.items():
            chosen = OmegaConf.select(effective, reg.key)
            cls = reg.params_class(chosen) if chosen in reg else None
            notes = _comments(cls) if cls is not None else {}
            extra[sec] = [
                f"  {sec}.{f.name} = {_fmt(OmegaConf.select(effective, f'{sec}.{f.name}'))}  "
                f"# {reg.what} {chosen}: {notes.get(f.name, '')}".rstrip()
                for f in (dataclasses.fields(cls) if cls is not None else [])
            ]
    for key, (default, text) in keys.items():
        head = key.split(".")[0] if "." in key else "(top level)"
        if head != section:
            rows += extra.get(section, [])
            rows.append(f"\n{head}:")
            section = head
        value = default if effective is None else OmegaConf.select(effective, key, default=default)
        rows.append(f"  {key} = {_fmt(value)}" + (f"  # {text}" if text else ""))
    rows += extra.get(section, [])
    rows.append("\n== Options of each axis (key=option) and their parameters ==")
    rows.append(options_text())
    # "$" is doubled: Hydra fills the help template with string.Template
    return "\n".join(rows).lstrip("\n").replace("$", "$$")


def register_help() -> None:
    """Register the ``prorl_bench_help`` resolver that ``hydra.help.template`` (conf/config.yaml)
    calls, so ``prorl-bench --help`` lists every key. Called by the CLI (app.py) next to
    ``config.register_configs``; kept here so config/ never imports this module (no cycle)."""
    if not OmegaConf.has_resolver("prorl_bench_help"):
        OmegaConf.register_new_resolver("prorl_bench_help", help_text)


# --------------------------------------------------------------------------- the command line, before Hydra


def _groups(sweeps: bool = True) -> set[str]:
    """Config groups a ``group=option`` override may name (conf/ and sweeps/ subdirectories)."""
    from prorl_bench.searchpath import CONF_DIR, SWEEPS_DIR

    dirs = (CONF_DIR, SWEEPS_DIR) if sweeps else (CONF_DIR,)
    return {p.name for d in dirs if d.is_dir() for p in d.iterdir() if p.is_dir()}


def _plugins(args: list[str]) -> list[str]:
    """The modules named by ``plugins=[a,b]`` on a command line (loaded before keys are judged)."""
    for arg in args:
        pair = _split(arg)
        if pair is not None and pair[0] == "plugins":
            return [m.strip() for m in pair[1].strip("[]").split(",") if m.strip()]
    return []


def _option_keys(section: str) -> set[str]:
    """Every parameter key of every registered option of the axis whose section is ``section``."""
    reg = SECTIONS.get(section)
    if reg is None:
        return set()
    return {
        f.name for name in reg.names() if (cls := reg.params_class(name)) is not None for f in dataclasses.fields(cls)
    }


def force_option_params(args: list[str]) -> list[str]:
    """The command line with ``++`` before an option parameter whose option the same line selects by
    value (``reset.trigger=every_after reset.every=4``): that option's YAML (if any) was not composed,
    so Hydra has no such key to override. Parameters of options selected by group (``reset=periodic``)
    are in their YAML and are left as typed. ``engine=NAME`` selects a plugin's engine by value
    (``_engine_by_value``)."""
    registry.load_plugins(_plugins(args))
    args = [_engine_by_value(a) for a in args]
    pairs = [_split(a) for a in args]
    selected = {
        reg.section: pair[1]
        for pair in pairs
        if pair is not None
        for reg in SECTIONS.values()
        if pair[0] == reg.key and pair[1] in reg
    }
    out = []
    for arg, pair in zip(args, pairs):
        section, _, leaf = (pair[0] if pair else "").partition(".")
        reg = SECTIONS.get(section)
        if pair is not None and not arg.startswith("+") and section in selected and reg is not None:
            cls = reg.params_class(selected[section])
            if cls is not None and leaf in {f.name for f in dataclasses.fields(cls)}:
                arg = "++" + arg
        out.append(arg)
    return out


def _engine_by_value(arg: str) -> str:
    """``engine=NAME`` without a YAML of its own as ``engine.name=NAME``: the engine group's YAMLs only
    select an engine, so the group's name selects a plugin's engine as it selects a built-in's, and an
    unknown name is the config error of ``engine.name`` listing the registered engines (not Hydra's list
    of YAML files). A YAML's name, a list, a sweep and ``+`` are left to Hydra."""
    from prorl_bench.searchpath import CONF_DIR

    pair = _split(arg)
    if arg.startswith("+") or pair is None or pair[0] != "engine" or not pair[1].isidentifier():
        return arg
    return arg if (CONF_DIR / "engine" / f"{pair[1]}.yaml").is_file() else f"engine.name={pair[1]}"


def _unknown_at(key: str, groups: set[str], root: Any) -> str | None:
    """The dataclass path under which ``key``'s next component is not a field (``""`` for the top
    level), or None when the key exists or is not the schema's to judge (Hydra's own keys, groups,
    free-form dicts such as ``task.generator_args``; an option's parameter, ``reset.every``,
    is checked against the selected option by ``to_config``)."""
    if "/" in key or "@" in key or key.split(".")[0] == "hydra":
        return None
    obj: Any = root
    parts = key.split(".")
    for i, part in enumerate(parts):
        names = {f.name for f in dataclasses.fields(obj)} - {PARAMS}
        if i == 1:  # an option's parameter (reset.every, task.generator_args.<name>): flat in its section
            names |= _option_keys(parts[0])
        if part not in names:
            at_top = i == 0 and (part in groups or part in config_module.GRID_KEYS)
            return None if at_top else ".".join(parts[:i])
        if not hasattr(obj, part):
            return None  # an option's parameter: to_config checks it against the selected option
        obj = getattr(obj, part)
        if not dataclasses.is_dataclass(obj):
            return None  # a leaf (a deeper key is Hydra's error to give) or a free-form dict
    return None


def _split(arg: str) -> tuple[str, str] | None:
    """``(key, value)`` of an override (``+``/``++`` dropped), None for flags and deletions."""
    if arg.startswith(("-", "~")) or "=" not in arg:
        return None
    key, value = arg.split("=", 1)
    return key.lstrip("+"), value


def check_overrides(args: list[str]) -> tuple[list[str], list[str]]:
    """Check a command line's ``key=value`` overrides against the schema before Hydra composes it.

    ``args``: a command line; flags and their values are not overrides and pass through in place.
    Returns ``(problems, corrected)``: one message per key the bench does not have — a TRL or verl
    name gets its translation with the value carried over (``prorl_bench.config.aliases``), another
    unknown key the closest keys by spelling — and the command line with every translation applied
    (empty ``problems``: nothing to say). With or without ``+``: Hydra would otherwise stop at
    "Key 'learning_rate' is not in struct" (no ``+``) or add the key (``+``)."""
    import difflib

    from prorl_bench.config import aliases

    registry.load_plugins(_plugins(args))  # their options' parameters are keys too
    groups = _groups()
    root = config_module.Config()  # the schema with its defaults (sections are dataclass instances)
    conf_groups = _groups(sweeps=False)  # sweeps/ groups are added with "+": not a spelling to suggest
    sections = frozenset(f.name for f in dataclasses.fields(config_module.Config))
    pairs = [_split(a) for a in args]
    given = {p[0]: p[1] for p in pairs if p is not None}
    problems: list[str] = []
    corrected: list[str] = []
    for arg, pair in zip(args, pairs):
        parent = None if pair is None else _unknown_at(pair[0], groups, root)
        if pair is None or parent is None:
            corrected.append(arg)
            continue
        key, value = pair
        hint = aliases.translate(key, value, given, sections)
        if hint is not None:
            problems.append(hint.message(key))
            corrected += hint.overrides
            continue
        leaf = key[len(parent) + 1 :].split(".")[0] if parent else key.split(".")[0]
        node: Any = root
        for part in [p for p in parent.split(".") if p]:
            node = getattr(node, part)
        names = [f.name for f in dataclasses.fields(node) if f.name != PARAMS] + (
            sorted(conf_groups) if not parent else []
        )
        names += sorted(_option_keys(parent))  # every option's parameters, for a misspelled one
        prefix = f"{parent}." if parent else ""
        close = difflib.get_close_matches(leaf, list(dict.fromkeys(names)), n=3, cutoff=0.6)
        nested = [k for k in field_help() if k.rsplit(".", 1)[-1] == key] if "." not in key else []
        if parent in SECTIONS and leaf == PARAMS and key.count(".") == 2:  # the old nested spelling
            close, prefix = [key.rsplit(".", 1)[-1]], f"{parent}."
        if nested:  # a key typed without its section (placement= for kl_estimator.placement=)
            close, prefix = nested, ""
        where = f"{parent} has no key {leaf!r}" if parent else f"no top-level key or group {leaf!r}"
        if close:
            problems.append(f"unknown config key {key} ({where}): did you mean "
                            + " or ".join(f"{prefix}{c}={value}" for c in close) + "?")  # fmt: skip
            corrected.append(f"{prefix}{close[0]}={value}")
        else:
            problems.append(f"unknown config key {key} ({where}; `prorl-bench --help` lists every key)")
            corrected.append(arg)
    return problems, corrected

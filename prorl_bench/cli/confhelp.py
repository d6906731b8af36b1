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
from typing import Any

from prorl_bench import config as config_module


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
    """Every leaf key of the schema -> (default, help text or None)."""
    out: dict[str, tuple[Any, str | None]] = {}
    comments = _class_comments(schema)
    defaults = schema()
    for f in dataclasses.fields(schema):
        value = getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            out.update(field_help(type(value), f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = (value, comments.get(f.name))
    return out


def _fmt(value: Any) -> str:
    value = getattr(value, "value", value)
    return "null" if value is None else str(value)


def help_text() -> str:
    """Every key with its default and help, grouped by section."""
    rows, section = [], None
    for key, (default, text) in field_help().items():
        head = key.split(".")[0] if "." in key else "(top level)"
        if head != section:
            rows.append(f"\n{head}:")
            section = head
        rows.append(f"  {key} = {_fmt(default)}" + (f"  # {text}" if text else ""))
    # "$" is doubled: Hydra fills the help template with string.Template
    return "\n".join(rows).lstrip("\n").replace("$", "$$")


def register_help() -> None:
    """Register the ``prorl_bench_help`` resolver that ``hydra.help.template`` (conf/config.yaml)
    calls, so ``prorl-bench --help`` lists every key. Called by the CLI (app.py) next to
    ``config.register_configs``; kept here so config/ never imports this module (no cycle)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("prorl_bench_help"):
        OmegaConf.register_new_resolver("prorl_bench_help", help_text)


# --------------------------------------------------------------------------- the command line, before Hydra


def _groups(sweeps: bool = True) -> set[str]:
    """Config groups a ``group=option`` override may name (conf/ and sweeps/ subdirectories)."""
    from prorl_bench.searchpath import CONF_DIR, SWEEPS_DIR

    dirs = (CONF_DIR, SWEEPS_DIR) if sweeps else (CONF_DIR,)
    return {p.name for d in dirs if d.is_dir() for p in d.iterdir() if p.is_dir()}


def _unknown_at(key: str, groups: set[str], root: Any) -> str | None:
    """The dataclass path under which ``key``'s next component is not a field (``""`` for the top
    level), or None when the key exists or is not the schema's to judge (Hydra's own keys, groups,
    free-form dicts such as ``detector.params``)."""
    if "/" in key or "@" in key or key.split(".")[0] == "hydra":
        return None
    obj: Any = root
    parts = key.split(".")
    for i, part in enumerate(parts):
        names = {f.name for f in dataclasses.fields(obj)}
        if part not in names:
            at_top = i == 0 and (part in groups or part in config_module.GRID_KEYS)
            return None if at_top else ".".join(parts[:i])
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
        names = [f.name for f in dataclasses.fields(node)] + (sorted(conf_groups) if not parent else [])
        prefix = f"{parent}." if parent else ""
        close = difflib.get_close_matches(leaf, list(dict.fromkeys(names)), n=3, cutoff=0.6)
        nested = [k for k in field_help() if k.rsplit(".", 1)[-1] == key] if "." not in key else []
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

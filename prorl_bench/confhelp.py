"""Help text for every config key, read from the schema's own comments (one place for each fact).

Each field of the dataclasses in ``config.py`` carries a comment — on its line, or on the comment
lines just above it. ``field_help()`` collects them by walking the schema; ``prorl-bench --help``
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
    ``config.register_configs``; kept here so config.py never imports this module (no cycle)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("prorl_bench_help"):
        OmegaConf.register_new_resolver("prorl_bench_help", help_text)

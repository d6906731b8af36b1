"""``task.chat_template``: a Jinja chat template given as text or as a file, checked when the config is."""

from __future__ import annotations

from pathlib import Path

from prorl_bench.registry import ConfigError


def resolve_chat_template(value: str) -> str:
    """``task.chat_template``: template text (it contains ``{{`` or ``{%``), or the path of a file
    holding one (read as UTF-8). Anything else is a ConfigError naming the key."""
    if "{{" in value or "{%" in value:
        return value
    p = Path(value).expanduser()
    if not p.is_file():
        raise ConfigError(
            f"invalid config value task.chat_template={value!r}: allowed a Jinja chat template (text with "
            "{{ or {%) or an existing file holding one"
        )
    text = p.read_text(encoding="utf-8")
    if "{{" not in text and "{%" not in text:
        raise ConfigError(f"invalid config value task.chat_template={value!r}: {p} holds no Jinja template")
    return text

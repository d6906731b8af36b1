"""One mechanism for every option's parameters: flat keys in its axis's section, one dataclass per option.

An axis's config section (``reset``, ``opt_reset``, ``kl_estimator``, ``algo``, ``variant``, ``task``,
``detector``) holds its own fields (the selector — ``reset.trigger`` — and the keys every option shares,
``reset.min_spacing``) and, next to them, the selected option's parameters as flat keys
(``reset.every=25``). The option declares those keys with the dataclass it registers (``params=``,
registry.py); ``split_section`` moves them out of the section into its ``params`` entry, where the
section's ``__post_init__`` turns them into the checked instance (``bind_params``). The composed config
therefore carries only the selected option's keys, and a run binds each option once
(``Registry.build(name, section.params)``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import asdict, fields, is_dataclass
from typing import Any

from prorl_bench.registry import AXES, ConfigError, Registry

UNSET = "???"  # a parameter key with no value (OmegaConf's MISSING): the selected option's default applies
PARAMS = "params"  # the section field holding the option's parameters (never typed on the command line)
SECTIONS: dict[str, Registry] = {reg.section: reg for reg in AXES}  # section -> its registry

# Keys that moved (old prefix -> new prefix). The old name keeps working: a command line is rewritten
# with a note (``cli/preflight.py`` ``rename_moved``), a config file's nested section is read as the
# selected option's flat keys (``split_section``), and ``--help`` lists the new names only.
MOVED = {"task.code.": "task.", "task.reasoning_gym.": "task."}


class MovedKeyWarning(UserWarning):
    """A config file used a key's old name (``task: {code: {timeout_s: 3}}``); it was read as the new one."""


def moved_name(key: str) -> str | None:
    """The current name of a key given by its old name (``task.code.timeout_s`` -> ``task.timeout_s``), or None."""
    for old, new in MOVED.items():
        if key.startswith(old) and len(key) > len(old):
            return new + key[len(old) :]
    return None


def bind_params(reg: Registry, name: str, params: Any) -> Any:
    """The option's parameters as its dataclass instance (None: it declares none): a mapping of its
    flat keys is checked (``reg.params``), an instance of its own dataclass is kept as it is."""
    cls = reg.params_class(reg.check(name))
    if cls is not None and isinstance(params, cls):
        return params
    if params is None or isinstance(params, Mapping):
        return reg.params(name, params)
    raise ConfigError(f"invalid config value {reg.section}: parameters of {reg.what} {name!r} given as {params!r}")


def common_keys(section_cls: type) -> set[str]:
    """The keys a section has whatever option is selected (its dataclass fields but ``params``)."""
    return {f.name for f in fields(section_cls)} - {PARAMS}


def split_section(node: Mapping[str, Any], section: str, section_cls: type) -> dict[str, Any]:
    """``node`` (a section's plain mapping) with the keys that are not the section's own moved into
    ``params``. A nested ``params`` mapping (the old spelling, ``reset.params.every``) is refused with
    the flat key to use instead."""
    out: dict[str, Any] = {}
    params: dict[str, Any] = {}
    own = common_keys(section_cls)
    node = _flatten_moved(node, section)
    for key, value in node.items():
        if key == PARAMS:
            if value:  # {} or None: nothing given
                first = next(iter(value)) if isinstance(value, Mapping) else value
                raise ConfigError(
                    f"unknown config key {section}.{PARAMS}.{first}: an option's parameters are flat keys of its "
                    f"section; did you mean {section}.{first}?"
                )
            continue
        if key not in own and value == UNSET:
            continue  # a parameter nobody set (Hydra's base carries the key): the option's default applies
        (out if key in own else params)[key] = value
    out[PARAMS] = params
    return out


def _flatten_moved(node: Mapping[str, Any], section: str) -> dict[str, Any]:
    """``node`` with a nested section of an old name (``code: {timeout_s: 3}`` in ``task``) read as flat
    keys when it belongs to the selected option (``task.name=code``), and dropped otherwise: another
    option's section never reached a run before either."""
    out = dict(node)
    reg = SECTIONS.get(section)
    for old in MOVED:
        head, _, rest = old.rstrip(".").partition(".")
        if head != section or rest not in out or not isinstance(out[rest], Mapping):
            continue
        nested = out.pop(rest)
        if reg is not None and out.get(reg.selector) == rest:
            keys = ", ".join(f"{MOVED[old]}{k}" for k in nested)
            warnings.warn(
                f"{section}.{rest}.* is an old name: read as {MOVED[old]}* ({keys})", MovedKeyWarning, stacklevel=3
            )
            out.update(nested)  # over the option's YAML defaults (task/code.yaml sets the flat keys)
    return out


def flat_params(section_obj: Any) -> dict[str, Any]:
    """The selected option's parameters of a validated section, as flat keys with plain values."""
    params = getattr(section_obj, PARAMS, None)
    if params is None or not is_dataclass(params):
        return {}
    return {k: getattr(v, "value", v) for k, v in asdict(params).items()}

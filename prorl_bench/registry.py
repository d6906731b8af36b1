"""Open registries for the bench's pluggable axes.

An option registers itself next to its code, as verl's ``@register_adv_est`` does::

    @ADVANTAGES.register("my_estimator")
    def my_estimator(rewards, eps): ...

and ``algo.advantage=my_estimator`` is then a valid config value — no edit of ``config.py``. Config
validation checks every axis against its registry and names the key and what is allowed, with the
same message as any other bad value. A test module (or a user's plugin module imported before the
config is validated) can register options the package does not ship.

Registries hold objects only; they import nothing of the bench. ``load_builtins`` imports the
modules whose options register at import time (lazily: those modules import ``config``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value is invalid. The message names the key and what is allowed."""


class Registry(Generic[T]):
    """Name -> object for one config axis (``key`` is the config key it validates, for messages)."""

    def __init__(self, key: str, what: str) -> None:
        self.key = key
        self.what = what
        self._items: dict[str, T] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **meta: Any) -> Callable[[T], T]:
        """Decorator: register ``obj`` under ``name`` with optional metadata (read by ``meta``)."""

        def deco(obj: T) -> T:
            self.add(name, obj, **meta)
            return obj

        return deco

    def add(self, name: str, obj: T, **meta: Any) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{self.what} name must be an identifier, got {name!r}")
        if name in self._items and self._items[name] is not obj:
            raise ValueError(f"{self.what} {name!r} is already registered ({self._items[name]!r})")
        self._items[name] = obj
        self._meta[name] = dict(meta)

    def remove(self, name: str) -> None:
        """Unregister (tests that register toy options clean up after themselves)."""
        self._items.pop(name, None)
        self._meta.pop(name, None)

    def check(self, name: Any, key: str | None = None) -> str:
        """Return ``name`` if registered; else ConfigError naming the key and the allowed names."""
        load_builtins()
        if not isinstance(name, str) or name not in self._items:
            raise ConfigError(f"invalid config value {key or self.key}={name!r}: allowed {', '.join(self.names())}")
        return name

    def __getitem__(self, name: str) -> T:
        return self._items[self.check(name)]

    def meta(self, name: str) -> dict[str, Any]:
        self.check(name)
        return self._meta[name]

    def names(self) -> list[str]:
        load_builtins()
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        load_builtins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


ADVANTAGES: Registry[Callable[..., Any]] = Registry("algo.advantage", "advantage estimator")
KL_ESTIMATORS: Registry[Callable[..., Any]] = Registry("kl_estimator.name", "KL estimator")
TASKS: Registry[Callable[..., Any]] = Registry("task.name", "task")
RESET_TRIGGERS: Registry[type] = Registry("reset.trigger", "reset trigger")
OPT_TRANSFORMS: Registry[Callable[..., Any]] = Registry("opt_reset.kind", "optimizer-state transform")
REFERENCES: Registry[type] = Registry("variant.reference", "reference strategy")
DETECTORS: Registry[type] = Registry("detector.name", "detector")

# Modules whose import registers the built-in options.
BUILTIN_MODULES = (
    "prorl_bench.advantages",
    "prorl_bench.kl",
    "prorl_bench.tasks",
    "prorl_bench.code_task",
    "prorl_bench.resets",
    "prorl_bench.opt_state",
    "prorl_bench.reference",
    "prorl_bench.detectors",
    "prorl_bench.hack_task",
)
_loaded = False


def load_builtins() -> None:
    """Import the modules that register the built-in options (once; safe to call repeatedly)."""
    global _loaded
    if _loaded:
        return
    _loaded = True  # set first: the modules' own imports may call back into a registry
    for mod in BUILTIN_MODULES:
        importlib.import_module(mod)

"""Open registries for the bench's pluggable axes.

An option registers itself next to its code, as verl's ``@register_adv_est`` does::

    @ADVANTAGES.register("my_estimator")
    def my_estimator(rewards, eps): ...

and ``algo.advantage=my_estimator`` is then a valid config value — no edit of ``config/``. Config
validation checks every axis against its registry and names the key and what is allowed, with the
same message as any other bad value. A test module (or a user's plugin module imported before the
config is validated) can register options the package does not ship.

An option that takes parameters registers a small dataclass with it (``params=MyParams``, one per
option). Its fields are the option's keys, flat in the axis's config section next to the selector
(``reset.every`` for ``reset.trigger=periodic``; ``opt_reset.factor`` for ``opt_reset.kind=soft``), and
their defaults are the values a run uses when the key is not given: ``config/options.py`` moves the
keys out of the section and ``Registry.params`` checks them against the dataclass (unknown key with a
did-you-mean, types, the dataclass's own ``__post_init__``), once, when the config is validated.
``Registry.build(name, params)`` then returns the option with that instance bound (``Bound``): no call
site passes parameters again and nothing is re-validated in the math. Other metadata (``**meta``)
states what the rest of the bench needs to know about an option — warnings and tests read it, never
names.

Two halves, one name. What config validation and ``--help`` need — the description, the parameters,
the facts other checks read — can be *declared* on its own (``Registry.declare``): the built-in
options are declared in ``config/builtin_options.py``, so validating a config needs neither torch nor
any layer above config. The code registers under the same name where it lives (``register``; rl/ and
tasks/ import their option modules in their ``__init__``). A plugin registers both in one call.

Registries hold objects only; they import nothing of the bench, by name or otherwise. Installed
plugins (the ``prorl_bench.plugins`` entry-point group) load at the first lookup; a user's modules
named by ``plugins=[...]`` load through ``load_plugins``.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import fields, is_dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value is invalid. The message names the key and what is allowed."""


class NotImplementedOption(LookupError):
    """An option is declared (config validation knows it) but no code is registered under its name."""


class Registry(Generic[T]):
    """Name -> option for one config axis (``key`` is the config key it validates, for messages): what
    each option declares (description, ``params``, metadata) and, once registered, its code."""

    def __init__(self, key: str, what: str) -> None:
        self.key = key
        self.what = what
        self.section, self.selector = key.split(".", 1)  # "reset", "trigger": the parameters live in "reset"
        self._items: dict[str, T] = {}  # name -> code
        self._meta: dict[str, dict[str, Any]] = {}  # name -> what it declares (every known option)
        self._doc: dict[str, str] = {}  # name -> one-line description (--help)

    def declare(self, name: str, doc: str, **meta: Any) -> None:
        """Declare option ``name`` without its code: ``doc``, its one-line description (a whole
        sentence: ``--help`` prints it), ``params=`` its dataclass, and the metadata other checks read.
        Its code registers later under the same name (``register``) and may add metadata, never change
        a declared entry."""
        self._check_entry(name, meta)
        if name in self._meta:
            raise ValueError(f"{self.what} {name!r} is already declared or registered")
        if not isinstance(doc, str) or not doc.strip() or "\n" in doc:
            raise ValueError(f"{self.what} {name!r}: doc must be one line, got {doc!r}")
        self._meta[name] = dict(meta)
        self._doc[name] = doc

    def register(self, name: str, **meta: Any) -> Callable[[T], T]:
        """Decorator: register ``obj`` under ``name`` with optional metadata (read by ``meta``)."""

        def deco(obj: T) -> T:
            self.add(name, obj, **meta)
            return obj

        return deco

    def add(self, name: str, obj: T, **meta: Any) -> None:
        """Register ``obj`` as ``name``'s code. ``params``: a dataclass of the option's parameters (or
        None). When ``name`` was declared, ``meta`` adds to the declaration (a declared entry given
        again must be the same object)."""
        self._check_entry(name, meta)
        if name in self._items and self._items[name] is not obj:
            raise ValueError(f"{self.what} {name!r} is already registered ({self._items[name]!r})")
        declared = {} if name in self._items else self._meta.get(name, {})
        if meta.get("params") is None and "params" in declared:
            meta.pop("params", None)  # the code of a declared option need not restate its parameters
        clash = sorted(k for k in meta if k in declared and meta[k] is not declared[k])
        if clash:
            raise ValueError(f"{self.what} {name!r}: {', '.join(clash)} differ from what it declared")
        self._items[name] = obj
        self._meta[name] = {**declared, **meta}
        self._doc.setdefault(name, _first_paragraph(getattr(obj, "__doc__", None)))

    def _check_entry(self, name: str, meta: Mapping[str, Any]) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{self.what} name must be an identifier, got {name!r}")
        if meta.get("params") is not None and not (isinstance(meta["params"], type) and is_dataclass(meta["params"])):
            raise ValueError(f"{self.what} {name!r}: params= must be a dataclass type, got {meta['params']!r}")

    def remove(self, name: str) -> None:
        """Unregister (tests that register toy options clean up after themselves)."""
        self._items.pop(name, None)
        self._meta.pop(name, None)
        self._doc.pop(name, None)

    def check(self, name: Any, key: str | None = None) -> str:
        """Return ``name`` if known; else ConfigError naming the key and the allowed names."""
        _load_installed()
        if not isinstance(name, str) or name not in self._meta:
            raise ConfigError(f"invalid config value {key or self.key}={name!r}: allowed {', '.join(self.names())}")
        return getattr(name, "value", name)  # a kind given as its enum member (GrowthKind.rank): its name

    def __getitem__(self, name: str) -> T:
        """The code registered as ``name`` (NotImplementedOption: declared, but its code is not loaded)."""
        self.check(name)
        if name not in self._items:
            raise NotImplementedOption(
                f"{self.what} {name!r} is declared but no code is registered under that name: the module that "
                "implements it registers it when imported (rl/ and tasks/ import theirs in their __init__)"
            )
        return self._items[name]

    def implemented(self, name: str) -> bool:
        """Whether code is registered under ``name`` (a declared option's code may not be loaded yet)."""
        return self.check(name) in self._items

    def meta(self, name: str) -> dict[str, Any]:
        """What ``name`` declares (and its code added when registered)."""
        self.check(name)
        return self._meta[name]

    def hook(self, name: str, attr: str) -> Any:
        """A fact ``name`` states for config time: ``attr=`` in its metadata, else an attribute of its
        code if loaded (a trigger's ``period`` classmethod); None when it states none."""
        meta = self.meta(name)
        if attr in meta:
            return meta[attr]
        return getattr(self._items.get(name), attr, None)

    def description(self, name: str) -> str:
        """The one-line description ``--help`` prints: the declared one, else the first paragraph of
        the code's docstring joined into one line ("" when it has none)."""
        self.check(name)
        return self._doc.get(name, "")

    def params_class(self, name: str) -> type | None:
        """The dataclass ``name`` registered with ``params=`` (None: it takes no parameters)."""
        return self.meta(name).get("params")

    def params(self, name: str, mapping: Mapping[str, Any] | None, key: str | None = None) -> Any:
        """The option's parameters: ``mapping`` (flat keys of the config section ``key``, default
        ``self.section``) checked against the dataclass the option registered with ``params=``,
        returned as an instance; None when it declared none. ConfigError names the key
        (``reset.evry``: unknown, with the closest names; wrong type; out of range)."""
        key = key or self.section
        cls = self.params_class(name)
        given = dict(mapping or {})
        allowed = [] if cls is None else [f.name for f in fields(cls)]
        unknown = sorted(set(given) - set(allowed))
        if unknown:
            bad = unknown[0]
            takes = ", ".join(f"{key}.{a}" for a in allowed) or "no parameters"
            close = difflib.get_close_matches(bad, allowed, n=3, cutoff=0.6)
            hint = "; did you mean " + " or ".join(f"{key}.{c}" for c in close) + "?" if close else ""
            raise ConfigError(f"unknown config key {key}.{bad}: {self.what} {name!r} takes {takes}{hint}")
        if cls is None:
            return None
        from omegaconf import OmegaConf  # type-checks and converts the values as the schema does (once)

        try:
            return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), given))
        except ConfigError:
            raise
        except Exception as e:  # a wrong type or a missing required value: name the key
            sub = getattr(e, "full_key", None) or ""
            what = str(e).split("\n", 1)[0]
            if sub:
                raise ConfigError(f"invalid config value {key}.{sub}={given.get(sub)!r}: {what}") from None
            raise ConfigError(f"invalid config value {key}: {what}") from None

    def build(self, name: str, params: Any = None) -> Bound:
        """``name`` with its parameters bound, for the run to call: ``params`` is an instance of the
        option's dataclass (checked when it was made: no check here), a mapping of its keys (checked
        now, once), or None (the dataclass's defaults)."""
        obj = self[name]
        cls = self.params_class(name)
        if cls is not None and isinstance(params, cls):
            bound = params
        elif cls is None and params is None:
            bound = None
        else:
            bound = self.params(name, params)
        return Bound(name, obj, bound, self._meta[name])

    def names(self) -> list[str]:
        _load_installed()
        return list(self._meta)

    def __contains__(self, name: object) -> bool:
        _load_installed()
        return isinstance(name, str) and name in self._meta  # a list from the command line is no option

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _first_paragraph(doc: str | None) -> str:
    """A docstring's first paragraph as one line (a description is never cut mid-sentence)."""
    text = (doc or "").strip().split("\n\n", 1)[0]
    return " ".join(text.split())


class Bound:
    """A registered option with its parameters bound: calling it calls the option with
    ``params=<instance>`` added (nothing added when the option takes none). ``name``, ``params`` and
    ``meta`` (its registration metadata) say what it is."""

    __slots__ = ("name", "obj", "params", "meta", "_call")

    def __init__(self, name: str, obj: Any, params: Any, meta: Mapping[str, Any]) -> None:
        self.name, self.obj, self.params, self.meta = name, obj, params, meta
        self._call = obj if params is None else functools.partial(obj, params=params)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Bound({self.name!r}, params={self.params!r})"


ADVANTAGES: Registry[Callable[..., Any]] = Registry("algo.advantage", "advantage estimator")
KL_ESTIMATORS: Registry[Callable[..., Any]] = Registry("kl_estimator.name", "KL estimator")
TASKS: Registry[Callable[..., Any]] = Registry("task.name", "task")
RESET_TRIGGERS: Registry[type] = Registry("reset.trigger", "reset trigger")
OPT_TRANSFORMS: Registry[Callable[..., Any]] = Registry("opt_reset.kind", "optimizer-state transform")
REFERENCES: Registry[type] = Registry("variant.reference", "reference strategy")
DETECTORS: Registry[type] = Registry("detector.name", "detector")
ENGINES: Registry[Any] = Registry("engine.name", "engine")  # an engines.base.Engine instance per name
# Kind-selected groups: their options are a closed set (an enum of the config), declared here so that each
# binds its own parameters like every other axis; their code is the run's, selected by the kind.
GROWTH: Registry[Any] = Registry("growth.kind", "growth kind")
KL_CONTROLLERS: Registry[Any] = Registry("kl_ctl.kind", "KL controller")
ADAPTERS: Registry[Any] = Registry("adapter.kind", "adapter kind")
ROUTE_USES: Registry[Any] = Registry("route.use", "use of the detector's labels")
KINDS = (GROWTH, KL_CONTROLLERS, ADAPTERS, ROUTE_USES)  # declared only: no code registers under them
AXES = (ADVANTAGES, KL_ESTIMATORS, TASKS, RESET_TRIGGERS, OPT_TRANSFORMS, REFERENCES, DETECTORS, ENGINES, *KINDS)

_CONFIG_CHECKS: list[Callable[[Any], None]] = []


def config_check(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    """Decorator: ``fn(cfg)`` runs when a whole ``Config`` is validated (after every group's own
    checks), for checks and warnings that span groups. It lives next to the options it is about."""
    if fn not in _CONFIG_CHECKS:
        _CONFIG_CHECKS.append(fn)
    return fn


def run_config_checks(cfg: Any) -> None:
    """Run every registered cross-group check, and each selected option's own ``check=`` metadata."""
    for reg in AXES:
        check = reg.hook(_lookup(cfg, reg.key), "check")
        if check is not None:
            check(cfg)
    for fn in _CONFIG_CHECKS:
        fn(cfg)


def _lookup(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def build_task(task_cfg: Any) -> Any:
    """The task ``task_cfg.name`` built from its factory: ``factory(task_cfg)``, with
    ``params=<its params instance>`` when it registered a dataclass."""
    return TASKS.build(task_cfg.name, getattr(task_cfg, "params", None))(task_cfg)


def require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """ConfigError ``invalid config value key=value: allowed ...`` unless ``ok`` (for params checks)."""
    if not ok:
        raise ConfigError(f"invalid config value {key}={value!r}: allowed {allowed}")


PLUGIN_GROUP = "prorl_bench.plugins"  # entry-point group of installed packages that register options
_declared = False  # the built-in options are declared (config/builtin_options.py calls builtins_declared)
_loaded = False  # the installed plugins are loaded


def builtins_declared() -> None:
    """Called once the built-in options are declared (by the config package, which declares them)."""
    global _declared
    _declared = True


def _load_installed() -> None:
    """Before the first lookup: the installed plugins' modules (the ``prorl_bench.plugins`` entry
    points), once. A lookup before the built-ins are declared is an error, not an empty axis."""
    global _loaded
    if not _declared:
        raise RuntimeError(
            "no built-in option is declared yet: the bench's config package declares them "
            "(import prorl_bench.config before looking an option up)"
        )
    if _loaded:
        return
    _loaded = True  # set first: a plugin's own imports may call back into a registry
    from importlib.metadata import entry_points

    for ep in entry_points(group=PLUGIN_GROUP):
        try:
            ep.load()
        except Exception as e:
            raise ConfigError(f"plugin entry point {ep.name}={ep.value} ({PLUGIN_GROUP}) failed to load: {e}") from e


def load_plugins(modules: Iterable[str]) -> None:
    """Import the user's modules named by ``plugins=[my_pkg.my_options, ...]`` (they register options
    at import time); called before the config is validated. A module that cannot be imported is a
    ConfigError naming it (and the import error), never a silently missing option."""
    _load_installed()
    for mod in modules:
        if not isinstance(mod, str) or not all(part.isidentifier() for part in mod.split(".")):
            raise ConfigError(f"invalid config value plugins={mod!r}: allowed dotted module names (my_pkg.my_options)")
        try:
            importlib.import_module(mod)
        except ImportError as e:
            raise ConfigError(
                f"invalid config value plugins={mod!r}: cannot import it ({e}); is its directory on PYTHONPATH?"
            ) from e

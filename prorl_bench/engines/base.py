"""``Engine``: what a trainer must provide to run a job of the bench, and how one is registered.

An engine is an option of the ``engine`` axis (``registry.ENGINES``, selected by ``engine.name``): the
native trainer (``engines/native.py``) and TRL's ``GRPOTrainer`` (``engines/trl/engine.py``) are two
implementations, and a plugin module can add a third (docs/extending.md, "Adding an engine"). The CLI,
the sweeps, SIGTERM handling and ``--resume`` go through this protocol only (``engines/dispatch.py``),
so they treat every engine alike.

**The run-directory contract** (docs/outputs.md). ``train(cfg, run_dir, ...)`` writes into ``run_dir``:

* ``config_resolved.yaml`` — ``resolved_config`` as given, once the start (or resume) is accepted;
* ``metrics.jsonl`` — one row per RL step with the metric keys of docs/outputs.md (NaN where the engine
  does not measure a value, never a guess);
* ``events.jsonl`` — ``start``, ``reset`` (with the shared reset sequence's fields, ``rl/reset_sequence.py``),
  ``resume``, ``preempted``, ``end``;
* ``validation.jsonl`` and ``samples.jsonl`` — the bench's held-out evaluation (``run/evaluation.py``);
* ``summary.json`` — ``status`` completed | failed | preempted and the figures of ``run/summary.py``;

and returns the summary dict. It holds ``run_dir``'s lock (``run/rundir.py``) while it runs, stops at
an RL-step end when ``stop_file`` appears or a preemption signal arrives (``run/signals.py``: raising
``Preempted`` after writing a checkpoint and a ``preempted`` summary), and re-run on the same
``run_dir`` resumes from its newest checkpoint (a finished run returns its summary, nothing rewritten).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from prorl_bench.config import Config
from prorl_bench.registry import ENGINES

E = TypeVar("E", bound=type)


@runtime_checkable
class Engine(Protocol):
    """A trainer the bench can run a job on (module docstring: the run-directory contract)."""

    def check(self, cfg: Config) -> None:
        """Raise ``ConfigError`` naming every key this engine cannot run, before anything is written.
        Called wherever a config is validated (``registry.run_config_checks``: the CLI's preflight, a
        sweep's up-front check) and again by ``dispatch.train``. Must not import torch: ``--help`` and
        config errors stay fast."""
        ...

    def train(
        self,
        cfg: Config,
        run_dir: Path,
        cache_root: Path,
        threads: int = 1,
        progress: bool = False,
        resolved_config: str | None = None,
        stop_file: Path | None = None,
    ) -> dict[str, Any]:
        """Run one experiment; write ``run_dir`` (the contract above); return the summary dict.
        ``cache_root``: where cached base policies live; ``threads``: torch threads; ``progress``: a
        progress bar; ``resolved_config``: the YAML text of ``config_resolved.yaml``; ``stop_file``: a
        sweep's STOP file."""
        ...


def register_engine(name: str, **meta: Any) -> Callable[[E], E]:
    """Class decorator: register an instance of the decorated class as engine ``name``
    (``registry.ENGINES``), so that its ``check`` is a bound method the config validation can call.
    A built-in engine is declared in config/builtin_options.py; a plugin's description is the first
    paragraph of its class docstring."""

    def deco(cls: E) -> E:
        engine = cls()
        if not isinstance(engine, Engine):
            raise TypeError(f"engine {name!r}: {cls.__name__} must define check(cfg) and train(cfg, run_dir, ...)")
        ENGINES.add(name, engine, **meta)
        return cls

    return deco


def get_engine(name: str) -> Engine:
    """The engine registered as ``name`` (ConfigError naming ``engine.name`` and the registered ones)."""
    return ENGINES[name]

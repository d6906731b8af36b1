"""Sandboxed execution of untrusted Python programs (``task=code``): the package's public names.

``harness`` runs a sample (``run_program``, ``run_many``, ``isolation``); ``limits`` holds the limits, results
and classes; ``host`` what this machine gives (interpreter, cgroup layout, seccomp program); ``pump`` reads a
running sample and classes its outcome; ``runner_fs`` + ``runner`` are the trusted runner's text (run as
``python -I -S -c``, behind ``seccomp``); ``cgroup``, ``seccomp`` and ``uids`` are the layers; ``errors`` the
sandbox's own failures. docs/code_task.md describes the design and its threat model.
"""

from prorl_bench.tasks.sandbox.errors import SandboxBroken, SandboxError
from prorl_bench.tasks.sandbox.harness import isolation, isolation_level, run_many, run_program
from prorl_bench.tasks.sandbox.host import Layers, default_hidden, interpreter, layers
from prorl_bench.tasks.sandbox.limits import (
    FAIL_CLASSES,
    LEVELS,
    WALL_MARGIN_S,
    Isolation,
    SandboxLimits,
    SandboxResult,
)

__all__ = [
    "FAIL_CLASSES", "LEVELS", "WALL_MARGIN_S", "Isolation", "Layers", "SandboxBroken", "SandboxError",
    "SandboxLimits", "SandboxResult", "default_hidden", "interpreter", "isolation", "isolation_level", "layers",
    "run_many", "run_program",
]  # fmt: skip

"""The sandbox's own failures (never a program's misbehaviour, which is always a per-sample class).

``SandboxError``: the sandbox failed on one sample. ``SandboxBroken``: the sandbox cannot run samples here
any more (its scratch directory, a cgroup, the uid counter, the seccomp filter, the runner's set-up):
every later sample would fail the same way, so a run must stop instead of training on zeros. The message
names what broke.
"""

from __future__ import annotations


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): e.g. its filesystem could not be built."""


class SandboxBroken(SandboxError):
    """A set-up step of the sandbox failed (the message names it): the run must stop (resumably)."""

    def __reduce__(self):
        return (type(self), self.args)

"""Which function samples a run's rollouts and held-out evaluations.

``rollout.generate`` unless the caller injects another with the same signature for the code running
in its context: a population's member threads set their member barrier here
(``population/lockstep.py``), so S single runs sample as one batch without any module being patched.
``setup.setup_run`` reads it once into ``RunContext.sample``; the phases call ``ctx.sample``. A
``ContextVar`` is per thread (a new thread starts from the default), so a member's sampler never
reaches another thread's run.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

from prorl_bench.models.rollout import Rollout, generate

Sampler = Callable[..., Rollout]  # rollout.generate's signature and result

SAMPLER: ContextVar[Sampler] = ContextVar("prorl_bench_sampler", default=generate)

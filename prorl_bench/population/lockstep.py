"""Lockstep members: S unchanged single runs in one process, their sampling batched across them.

Each member runs the project's own ``trainer.train`` in a thread of its own, so everything a run does
— its generators, references, AdamW and gradient clipping, resets and optimizer transforms, KL
control, guards, writers, checkpoints and resume — is the single run's code acting on that member's
objects alone. Two things make the members one computation:

* **one member runs at a time** (a run token, passed in member order). A member gives the token up
  only where it asks to sample; its global RNG states (torch, ``random``) are saved there and put
  back when it resumes, so no member can see another's global generator. The process does the work
  of one thread at a time, as S single-thread runs would.
* **sampling is a barrier**: every sampling call of a member thread's run is held until every live
  member waits on one (a run samples through the sampler its context injects, ``run/sampler.py``;
  each member thread sets it to this barrier, so no module is patched); then the waiting requests are sampled together
  (``sampling.generate_population``: one (S, B) batch per group of equal signatures) and each member
  continues with its own rollout. A member whose request cannot be batched (not a plain native
  policy) samples alone. If a batch raises, its generators are rewound and each member samples
  alone, so the error lands in the member that caused it and the others go on.

Stage timers: a member's ``time/*`` metrics are its own clock — wall time minus the time it waited
for the token, plus its share (1/n) of each batched sampling call it took part in (``member_clock``,
the clock each member thread injects into ``accounting.CLOCK``). So a member's ``time/step`` is what
its step cost inside the population, and the members' times add up to the population's wall time.

A member that finishes or fails leaves the barrier; the rest continue. Members need not be at the
same step (a resumed population whose members checkpointed at different steps batches them anyway).
"""

from __future__ import annotations

import inspect
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from prorl_bench.models import rollout
from prorl_bench.population.sampling import SampleRequest, generate_population
from prorl_bench.run.accounting import CLOCK
from prorl_bench.run.sampler import SAMPLER

_ORIGINAL_GENERATE = rollout.generate
_GENERATE_SIGNATURE = inspect.signature(_ORIGINAL_GENERATE)
_local = threading.local()  # .member: the member index of this thread; .pop: its Lockstep


class Lockstep:
    """Runs ``fns[i]()`` for every member in threads under the run token and the sampling barrier.

    ``stats``: ``batched_calls`` (batched sampling calls), ``batched_requests`` (member requests
    they served) and ``solo_calls`` (requests sampled alone).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._cv = threading.Condition()
        self._holder: int | None = None
        self._status = ["ready"] * size  # ready (wants the token) | running | barrier | done
        self._requests: dict[int, SampleRequest] = {}
        self._results: dict[int, Any] = {}
        self._rng: dict[int, tuple[torch.Tensor, object]] = {}
        self._waited = [0.0] * size  # seconds not charged to member i (waiting, others' sampling shares)
        self._since: list[float | None] = [None] * size
        self.stats = {"batched_calls": 0, "batched_requests": 0, "solo_calls": 0}

    # -- the run token
    def _acquire(self, i: int) -> None:
        with self._cv:
            self._status[i] = "ready"
            self._cv.wait_for(lambda: self._holder is None and i == min(self._ready()))
            self._holder, self._status[i] = i, "running"
            if self._since[i] is not None:
                self._waited[i] += time.perf_counter() - self._since[i]
                self._since[i] = None
        if i in self._rng:
            torch_state, py_state = self._rng.pop(i)
            torch.set_rng_state(torch_state)
            random.setstate(py_state)

    def _ready(self) -> list[int]:
        return [j for j, s in enumerate(self._status) if s == "ready"] or [self.size]

    def _give_up_token(self, i: int, status: str) -> None:
        """Called with the lock held by the token's holder."""
        if status != "done":
            self._rng[i] = (torch.get_rng_state(), random.getstate())
            self._since[i] = time.perf_counter()
        self._holder, self._status[i] = None, status
        self._maybe_sample()
        self._cv.notify_all()

    # -- the sampling barrier
    def generate(self, i: int, req: SampleRequest):
        """Member i's ``generate`` call: wait for the others, sample together, resume in turn."""
        with self._cv:
            self._requests[i] = req
            self._give_up_token(i, "barrier")
            self._cv.wait_for(lambda: i in self._results)
            result = self._results.pop(i)
        self._acquire(i)
        if isinstance(result, BaseException):
            raise result
        return result

    def _maybe_sample(self) -> None:
        """With the lock held: once every live member waits at the barrier, sample for all of them."""
        live = [j for j, s in enumerate(self._status) if s != "done"]
        if not live or any(self._status[j] != "barrier" for j in live):
            return
        try:
            groups: dict[tuple, list[int]] = {}
            for j in live:
                req = self._requests[j]
                key = req.signature() if req.batchable() else ("solo", j)
                groups.setdefault(key, []).append(j)
            for members in groups.values():
                self._sample(members)
        except BaseException as e:  # noqa: BLE001 - a fault here must reach every waiting member, not hang them
            for j in live:
                self._results.setdefault(j, e)
        self._requests.clear()
        for j in live:
            self._status[j] = "sampled"

    def member_clock(self, i: int) -> float:
        """Member i's own clock (seconds): wall time minus what is not its own work."""
        return time.perf_counter() - self._waited[i]

    def _sample(self, members: list[int]) -> None:
        t0 = time.perf_counter()
        try:
            self._sample_group(members)
        finally:
            share = (time.perf_counter() - t0) / len(members)
            for j in members:  # each member is charged its share of the batched call
                self._waited[j] -= share

    def _sample_group(self, members: list[int]) -> None:
        reqs = [self._requests[j] for j in members]
        if len(reqs) > 1:
            saved = [None if r.generator is None else r.generator.get_state() for r in reqs]
            try:
                for j, out in zip(members, generate_population(reqs)):
                    self._results[j] = out
                self.stats["batched_calls"] += 1
                self.stats["batched_requests"] += len(reqs)
                return
            except Exception:  # rewind the generators; each member samples alone and meets its own error
                for r, state in zip(reqs, saved):
                    if state is not None:
                        r.generator.set_state(state)
        for j, r in zip(members, reqs):
            self.stats["solo_calls"] += 1
            try:
                self._results[j] = _ORIGINAL_GENERATE(**r.call)
            except Exception as e:
                self._results[j] = e

    # -- running the members
    def run(self, fns: list[Callable[[], Any]]) -> list[Any]:
        """Run every member to its end; return each one's result (or the exception it raised)."""
        if len(fns) != self.size:
            raise ValueError(f"{len(fns)} member functions for a population of {self.size}")
        results: list[Any] = [None] * self.size

        def body(i: int) -> None:
            _local.member, _local.pop = i, self
            SAMPLER.set(_generate)  # this thread's runs sample through the barrier (run/sampler.py)
            CLOCK.set(lambda: self.member_clock(i))  # and time their stages on the member's own clock
            self._acquire(i)
            try:
                results[i] = fns[i]()
            except BaseException as e:  # noqa: BLE001 - handed to the caller, member by member
                results[i] = e
            finally:
                with self._cv:
                    self._give_up_token(i, "done")

        threads = [threading.Thread(target=body, args=(i,), name=f"member-{i}", daemon=True) for i in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results


def _generate(*args, **kwargs):
    """``rollout.generate`` for every caller: a member thread's call goes through its barrier.

    The arguments are bound to ``rollout.generate``'s own signature, so a keyword it gains later
    (e.g. a decode implementation) travels with the request and is replayed when it samples alone."""
    pop: Lockstep | None = getattr(_local, "pop", None)
    if pop is None:
        return _ORIGINAL_GENERATE(*args, **kwargs)
    bound = _GENERATE_SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    fields = ("policy", "tok", "prompt_ids", "prompt_mask", "max_new_tokens", "temperature", "top_k", "generator",
              "greedy", "top_p")  # fmt: skip
    req = SampleRequest(*(a[k] for k in fields), call=dict(a))
    return pop.generate(_local.member, req)

"""Per-stage wall timers, forward counters and FLOP accounting for one training step.

Stage names and counter keys are an output contract (README "Outputs"): ``time/<stage>``,
``count/policy_fwd``, ``count/ref_fwd``, ``tokens/policy_fwd``, ``tokens/ref_fwd``.
Timers synchronise CUDA before reading the clock so a stage is charged for its own kernels.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from prorl_bench.run.outputs import COUNTERS, STAGES

# The clock the stage timers read: the wall clock, unless the caller injects another for the code in its
# context (a population's member threads set their own clock, population/lockstep.py: wall time minus
# the time the member waited for the others). A ContextVar is per thread: a new thread starts from this.
CLOCK: ContextVar[Callable[[], float]] = ContextVar("prorl_bench_clock", default=time.perf_counter)

__all__ = ["COUNTERS", "STAGES", "StepAccounting", "measured_matmul_peak"]


class StepAccounting:
    """Collects timers (seconds), forward counts and FLOPs; ``reset()`` at the start of each step."""

    def __init__(self, device: torch.device) -> None:
        self._sync = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.times = {s: 0.0 for s in STAGES}
        self.counts = {c: 0 for c in COUNTERS}
        self.flops = 0.0
        self._open: list[list[float]] = []  # [start, time spent in nested stages] per open stage
        self._t0 = self._now()

    def _now(self) -> float:
        if self._sync:
            torch.cuda.synchronize()
        return CLOCK.get()()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a stage. Stages nest exclusively: A0's reference forward inside ``update`` is
        charged to ``ref_logprob`` and not to ``update``, so the stage times add up to the step."""
        if name not in self.times:
            raise KeyError(f"unknown stage {name!r}; stages are {STAGES}")
        frame = [self._now(), 0.0]
        self._open.append(frame)
        try:
            yield
        finally:
            self._open.pop()
            elapsed = self._now() - frame[0]
            self.times[name] += elapsed - frame[1]
            if self._open:
                self._open[-1][1] += elapsed

    def forward(self, who: str, tokens: int | torch.Tensor, flops: float | torch.Tensor) -> None:
        """Record one teacher-forced forward pass of ``who`` ('policy' or 'ref') over ``tokens``."""
        self.counts[f"count/{who}_fwd"] += 1
        # ``tokens``/``flops`` may be 0-d device tensors: they are summed lazily and read once in row(),
        # so counting a forward inside the update loop never forces a host<->device sync on GPU.
        self.counts[f"tokens/{who}_fwd"] = self.counts[f"tokens/{who}_fwd"] + tokens
        self.flops = self.flops + flops

    def add_flops(self, flops: float | torch.Tensor) -> None:
        self.flops = self.flops + flops

    def row(self, samples: int, generated_tokens: int, peak_flops: float) -> dict[str, float]:
        """The step's accounting fields; time/step is the wall time since ``reset()``."""
        step_time = self._now() - self._t0
        out: dict[str, float] = {f"time/{k}": v for k, v in self.times.items()}
        out["time/step"] = step_time
        self.counts = {k: int(v) for k, v in self.counts.items()}  # the step's one read of lazy counters
        self.flops = float(self.flops)
        out.update(self.counts)
        out["time/ref_share"] = self.times["ref_logprob"] / step_time if step_time > 0 else 0.0
        out["throughput/tokens_per_s"] = generated_tokens / step_time
        out["throughput/samples_per_s"] = samples / step_time
        out["perf/flops"] = self.flops
        out["perf/flops_per_s"] = self.flops / step_time
        out["perf/mfu"] = self.flops / step_time / peak_flops
        return out


_PEAK_CACHE: dict[str, float] = {}


def measured_matmul_peak(device: torch.device, dtype: torch.dtype = torch.float32, n: int | None = None,
                         trials: int = 5, reps: int = 3) -> float:  # fmt: skip
    """Achievable matmul FLOP/s on this device in ``dtype`` (the precision the run's matmuls use:
    bf16 under CUDA autocast) with the current thread count (cached per device, dtype and threads).

    The best of ``trials`` timings of ``reps`` (n x n) @ (n x n) products: a peak, so a busy
    moment during the measurement does not deflate it (which would inflate MFU). ``n`` defaults to
    1024 on CPU and 8192 on CUDA (a 1024^3 product does not fill a large GPU). On CUDA the
    measurement's memory is freed and the peak-memory counter reset afterwards, so it does not show
    up as the run's memory.
    """
    key = f"{device}:{dtype}:{torch.get_num_threads()}"
    if key not in _PEAK_CACHE:
        cuda = device.type == "cuda"
        n = n or (8192 if cuda else 1024)
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        a @ b  # warm-up
        best = float("inf")
        for _ in range(trials):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                a @ b
            if cuda:
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        _PEAK_CACHE[key] = 2.0 * n**3 * reps / best
        if cuda:
            del a, b
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
    return _PEAK_CACHE[key]

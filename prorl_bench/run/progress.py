"""Progress reports for long phases (the warm-up; the sweep monitor uses the formatting helpers).

One rule for every phase, so the output stays readable wherever it goes:

* ``progress=True`` on a terminal (stderr is a TTY): a tqdm bar, redrawn in place;
* ``progress=True`` elsewhere (a log file, a pipe, a sweep worker): plain lines, at most one every
  ``every_s`` seconds — no carriage returns, no flood;
* ``progress=False``: only the phase's first and last lines (what started, how it ended).
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO


def fmt_duration(seconds: float) -> str:
    """``3725`` -> ``'1h02m'``, ``250`` -> ``'4m10s'``, ``12.4`` -> ``'12s'``."""
    s = max(0, int(round(seconds)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def eta_seconds(done: float, elapsed: float, left: float) -> float | None:
    """Seconds until ``left`` more units are done at the rate seen so far (``done`` units in
    ``elapsed`` seconds); None before anything was done (no rate to extrapolate)."""
    if done <= 0 or elapsed <= 0 or not math.isfinite(left):
        return None
    return max(0.0, left) * elapsed / done


class PhaseReport:
    """Reports one long phase: ``update(n, status)`` with the absolute position ``n`` of ``total``,
    ``close(final)`` with the closing line. See the module docstring for what is printed where."""

    def __init__(
        self, desc: str, total: int, unit: str, progress: bool, start: str, every_s: float = 10.0,
        stream: TextIO | None = None,
    ) -> None:  # fmt: skip
        self.desc, self.total, self.unit, self.every_s = desc, total, unit, every_s
        self.stream = stream if stream is not None else sys.stderr
        self.lines = progress  # periodic lines (when no bar replaces them)
        self.bar = None
        self._t0 = self._last = time.perf_counter()
        self._say(f"{desc}: {start}")
        if progress and _isatty(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True, mininterval=0.5)

    def update(self, n: int, status: str) -> None:
        if self.bar is not None:
            self.bar.update(n - self.bar.n)
            self.bar.set_postfix_str(status, refresh=False)
            return
        now = time.perf_counter()
        if self.lines and now - self._last >= self.every_s:
            self._last = now
            self._say(f"{self.desc}: {n}/{self.total} {self.unit}s, {status} ({fmt_duration(now - self._t0)})")

    def close(self, final: str) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self._say(f"{self.desc}: {final} ({fmt_duration(time.perf_counter() - self._t0)})")

    def _say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or fake stream
        return False

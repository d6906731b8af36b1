"""Preemption signals (run/signals.py): ``Preempted`` crosses a process boundary."""

from __future__ import annotations

import pickle

from prorl_bench.run.signals import Preempted


# Audit item 11: Preempted could not cross a process boundary (joblib: BrokenProcessPool)
def test_preempted_survives_pickling():
    e = pickle.loads(pickle.dumps(Preempted(7, 15)))
    assert isinstance(e, Preempted) and (e.step, e.signum) == (7, 15) and "SIGTERM" in str(e)

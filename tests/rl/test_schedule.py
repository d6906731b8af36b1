"""The LR schedule (rl/schedule.py): warm-up, and a restart with a re-warm-up at a reset."""

from prorl_bench.rl.schedule import LRSchedule


def test_lr_schedule_restart_and_rewarmup():
    s = LRSchedule(1.0, warmup=4)
    assert [s.lr(t) for t in (1, 2, 4, 9)] == [0.25, 0.5, 1.0, 1.0]
    s.restart(11, 2)
    assert [s.lr(t) for t in (11, 12, 13)] == [0.5, 1.0, 1.0]

"""The KL coefficient controller (rl/kl_control.py): adaptive direction and bounds, fixed stays fixed."""

import pytest

from prorl_bench.config import AdaptiveKLParams, KLControlConfig, KLControlKind
from prorl_bench.rl.kl_control import KLController


def test_adaptive_kl_controller_direction_and_bounds():
    params = {"target": 0.1, "horizon": 10, "beta_min": 0.01, "beta_max": 0.2}  # flat keys kl_ctl.<key>
    cfg = KLControlConfig(kind=KLControlKind.adaptive, params=params)
    assert cfg.params == AdaptiveKLParams(**params)
    ctl = KLController(0.05, cfg.params)
    ctl.update(0.5)
    assert ctl.value == pytest.approx(0.05 * 1.02)  # error clipped at +20%, / horizon
    for _ in range(500):
        ctl.update(0.5)
    assert ctl.value == 0.2  # upper bound
    for _ in range(1000):
        ctl.update(0.0)
    assert ctl.value == 0.01  # lower bound
    v = ctl.value
    ctl.update(float("nan"))
    assert ctl.value == v
    ctl.update(0.1)  # on target: no change
    assert ctl.value == v
    ctl.restore()
    assert ctl.value == 0.05
    fixed = KLController(0.05, KLControlConfig(kind=KLControlKind.fixed).params)  # fixed takes no parameters
    fixed.update(10.0)
    assert fixed.value == 0.05

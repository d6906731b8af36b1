"""``rl/reset_sequence.py``: the one reset sequence every engine calls — its order of operations, the
LR-restart rule per transform, and that neither engine re-implements any part of it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import prorl_bench
from prorl_bench.rl import reset_sequence
from prorl_bench.rl.resets import ResetSchedule, reset_reference
from tests.conftest import make_config

PKG = Path(list(prorl_bench.__path__)[0])
OPT_RESETS = [
    ["opt_reset=keep"],
    ["opt_reset=hard"],
    ["opt_reset=soft", "opt_reset.rewarmup_steps=3"],
    ["opt_reset=asym", "opt_reset.m_factor=0.5", "opt_reset.v_factor=1.0"],
]


class Recorder:
    """A ``ResetTarget`` over a tiny model that records the order of the calls."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.policy, self.ref = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=0.1)
        self.policy(torch.ones(1, 3)).sum().backward()
        self.opt.step()
        self.calls: list[tuple] = []

    def reset_optimizer(self):
        self.calls.append(("optimizer",))
        return self.opt

    def move_reference(self, alpha):
        self.calls.append(("reference", alpha, self.opt.state[self.policy.weight]["exp_avg"].clone()))
        reset_reference(self.ref, self.policy, alpha)
        return {"moved": True}

    def restart_lr(self, start_step, warmup):
        self.calls.append(("lr", start_step, warmup))

    def after_reset(self, step):
        self.calls.append(("after", step))
        return {"next_lr": 0.1}


@pytest.mark.parametrize("over", OPT_RESETS, ids=lambda o: o[0])
def test_reference_then_optimizer_then_lr_then_marked(over):
    """decide reads the typed KL; reset moves the reference before the optimizer transform (the
    moments it sees are the untouched ones), restarts the LR by the shared rule, marks the trigger."""
    cfg = make_config(["variant=C", "reset=periodic", "reset.every=2", *over])
    sched, target = ResetSchedule(cfg.reset), Recorder()
    m_before = target.opt.state[target.policy.weight]["exp_avg"].clone()
    assert reset_sequence.decide(sched, 1, kl=0.1) is None
    reason = reset_sequence.decide(sched, 2, kl=0.1)
    assert reason is not None
    info = reset_sequence.reset(sched, 2, cfg.opt_reset, cfg.algo.lr_warmup_steps, target)
    kinds = [c[0] for c in target.calls]
    warmup = reset_sequence.lr_restart_warmup(cfg.opt_reset, cfg.algo.lr_warmup_steps)
    assert kinds == ["optimizer", "reference", *(["lr"] if warmup is not None else []), "after"]
    assert torch.equal(target.calls[1][2], m_before)  # the reference moved before the transform
    assert torch.equal(target.ref.weight, target.policy.weight)
    assert sched.last_reset == 2
    assert info["action"] == "copy" and info["moved"] and info["next_lr"] == 0.1
    assert {"m_norm_before", "m_norm_after", "v_norm_before", "v_norm_after"} <= set(info)


def _calls(path: Path) -> set[str]:
    """Names called in ``path`` (``f(...)`` and ``x.f(...)``) and names it defines."""
    tree = ast.parse(path.read_text())
    out = {getattr(n.func, "attr", getattr(n.func, "id", "")) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return out | {f"def {n.name}" for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("module", ["run/step_events.py", "engines/trl/callback.py"])
def test_no_engine_re_implements_the_sequence(module):
    """Each engine calls ``decide`` and ``reset``; none applies a transform, measures the moments or
    states the LR-restart rule itself (the TRL callback's own ``lr_restart`` was a copy of it)."""
    calls = _calls(PKG / module)
    assert {"decide", "reset"} <= calls, module
    own = {"apply_opt_reset", "moment_norms", "scale_moments", "def lr_restart", "def lr_restart_warmup"} & calls
    assert not own, f"{module} re-implements part of the reset sequence: {own}"


def test_the_lr_restart_rule_has_one_home():
    pytest.importorskip("transformers")
    from prorl_bench.engines.trl import callback
    from prorl_bench.run import step_events

    assert step_events.lr_restart_warmup is reset_sequence.lr_restart_warmup
    assert not hasattr(callback, "lr_restart")
    assert callback.reset_sequence is reset_sequence

"""``engine`` is a registered option (``registry.ENGINES``) with two implementations of the ``Engine``
protocol (``engines/base.py``): an unknown engine lists the registered ones, dispatch is a registry
lookup that calls the engine's ``check`` then its ``train``, looking an engine up imports neither torch
nor TRL, and both engines reset through the one sequence (``rl/reset_sequence.py``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from prorl_bench import registry
from prorl_bench.config import ConfigError
from prorl_bench.engines import dispatch
from prorl_bench.engines.base import Engine, get_engine, register_engine
from prorl_bench.rl import reset_sequence
from tests.conftest import make_config


def test_the_built_in_engines_are_registered_implementations():
    assert registry.ENGINES in registry.AXES and registry.ENGINES.key == "engine.name"
    assert registry.ENGINES.names()[:2] == ["native", "trl"]
    for name in ("native", "trl"):
        assert isinstance(get_engine(name), Engine) and registry.ENGINES.implemented(name)
        assert registry.ENGINES.description(name).endswith(".")


def test_an_unknown_engine_lists_the_registered_ones():
    with pytest.raises(ConfigError, match=r"invalid config value engine.name='typo': allowed native, trl"):
        make_config(["engine.name=typo"])


def test_dispatch_checks_then_trains_the_configured_engine(tmp_path):
    calls = []

    @register_engine("toy")
    class Toy:
        """A toy engine that records its calls."""

        def check(self, cfg):
            calls.append(("check", cfg.engine.name))

        def train(self, cfg, run_dir, cache_root, **kw):
            calls.append(("train", run_dir, kw))
            return {"status": "completed"}

    try:
        cfg = make_config(["engine.name=toy"])  # validation ran the engine's check (its option hook)
        assert calls == [("check", "toy")]
        assert dispatch.train(cfg, tmp_path, tmp_path, threads=1) == {"status": "completed"}
        assert calls[1:] == [("check", "toy"), ("train", tmp_path, {"threads": 1})]
        with pytest.raises(ConfigError, match="allowed native, trl, toy"):
            make_config(["engine.name=tyo"])
    finally:
        registry.ENGINES.remove("toy")


def test_register_engine_refuses_a_class_that_is_no_engine():
    with pytest.raises(TypeError, match="must define check"):

        @register_engine("broken")
        class Broken:
            def train(self, cfg, run_dir, cache_root, **kw): ...

    assert "broken" not in registry.ENGINES


def test_looking_an_engine_up_imports_neither_torch_nor_trl():
    """``dispatch`` and the engines are imported by the CLI before a config error is printed."""
    code = textwrap.dedent("""
        import sys
        from prorl_bench.engines import dispatch
        from prorl_bench.engines.base import get_engine
        get_engine("native"), get_engine("trl")
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "trl", "transformers"))[:3])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


@pytest.fixture
def sequence_calls(monkeypatch):
    """Every call of the shared sequence's ``decide`` and ``reset``, by whichever engine."""
    calls = []
    for name in ("decide", "reset"):
        real = getattr(reset_sequence, name)

        def spy(*a, _real=real, _name=name, **k):
            out = _real(*a, **k)
            calls.append((_name, out))
            return out

        monkeypatch.setattr(reset_sequence, name, spy)
    return calls


def test_the_native_trainer_resets_through_the_shared_sequence(run_exp, sequence_calls):
    run_exp(["variant=C", "reset=periodic", "reset.every=2", "opt_reset=hard", "steps=4"])
    assert [out is not None for name, out in sequence_calls if name == "decide"] == [False, True, False, True]
    assert sum(name == "reset" for name, _ in sequence_calls) == 2


@pytest.mark.parametrize("opt_reset", ["keep", "hard", "soft", "asym"])
def test_the_trl_callback_resets_through_the_shared_sequence_as_native_does(opt_reset, sequence_calls):
    """TRL's callback (bound to a tiny model and AdamW, no trainer) calls the sequence, and leaves the
    reference and the optimizer state exactly as the sequence does on a native-style target."""
    pytest.importorskip("transformers")
    from prorl_bench.engines.trl.callback import ReferenceResetCallback
    from prorl_bench.rl.resets import ResetSchedule, reset_reference

    def tiny():
        torch.manual_seed(0)
        policy, ref = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
        opt = torch.optim.AdamW(policy.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            policy(torch.ones(2, 4)).square().sum().backward()
            opt.step()
        return policy, ref, opt

    policy, ref, opt = tiny()
    cb = ReferenceResetCallback(reset={"kind": "periodic", "every": 1}, opt_reset=opt_reset)
    args = SimpleNamespace(steps_per_generation=1, num_iterations=1, gradient_accumulation_steps=1, beta=0.1)
    cb.bind(args=args, model=policy, optimizer=opt)
    cb.ref_model = ref
    info = cb.rl_step_end(1, kl=0.0)
    assert [name for name, _ in sequence_calls] == ["decide", "reset"]

    policy2, ref2, opt2 = tiny()  # the same sequence on a plain target: what native's NativeReset does
    sched = ResetSchedule(cb.reset_cfg)

    class Plain:
        def reset_optimizer(self):
            return opt2

        def move_reference(self, alpha):
            reset_reference(ref2, policy2, alpha)
            return {}

        def restart_lr(self, start_step, warmup):
            pass

        def after_reset(self, step):
            return {"next_lr": opt2.param_groups[0]["lr"]}

    assert reset_sequence.decide(sched, 1, 0.0) is not None
    want = reset_sequence.reset(sched, 1, cb.opt_cfg, 0, Plain())
    assert {k: v for k, v in info.items() if k != "reason"} == want
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), ref2.parameters()))
    for p, p2 in zip(policy.parameters(), policy2.parameters()):
        for key, value in opt.state[p].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(opt2.state[p2][key])), key

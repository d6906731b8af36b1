"""Runs that cannot be silently wrong: each test reproduces a defect an outside audit found."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from prorl_bench.config import ConfigError
from prorl_bench.rl.advantages import compute_advantages
from prorl_bench.run.checkpoint import CorruptFileError, load_verified, save_verified
from prorl_bench.run.outputs import read_jsonl
from prorl_bench.run.signals import Preempted
from tests.conftest import FAST, make_config, strip_timing

EXE = str(Path(sys.executable).with_name("prorl-bench"))


def _cli(run_dir, cache, *extra, timeout=300):
    cmd = [EXE, *FAST, "progress=false", "hardware.torch_threads=1", f"warmup.cache_dir={cache}"]
    cmd += [f"hydra.run.dir={run_dir}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


# 1. +key overrides were dropped silently but recorded as applied
@pytest.mark.parametrize(
    "override,hint",
    [
        ("+algo.learning_rate=1e-5", "algo.lr"),
        ("+beta=0.5", "algo.beta"),
        ("+num_generations=4", "algo.group_size"),
        ("+algo.lrr=1", "algo.lr"),
        ("+max_completion_length=64", "algo.max_new_tokens"),
    ],
)
def test_unknown_keys_are_an_error_however_they_arrive(override, hint):
    with pytest.raises(ConfigError, match=rf"unknown config key {override[1:].split('=')[0]}.*{hint}"):
        make_config([override])


# 2. a refused resume (or any config error) overwrote the finished run's record
@pytest.mark.slow
def test_a_refused_resume_leaves_the_run_untouched(tmp_path, base_cache):
    d = tmp_path / "run"
    assert _cli(d, base_cache, "algo.lr=0.002").returncode == 0
    assert "lr: 0.002" in (d / "config_resolved.yaml").read_text()  # written once the run was accepted
    assert json.loads((d / "summary.json").read_text())["status"] == "completed"
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"}
    for bad in (["algo.lr=0.5"], ["+algo.learning_rate=1"]):  # a refused resume; an unknown key
        r = _cli(d, base_cache, *bad)
        assert r.returncode == 2 and "config" in r.stderr, r.stderr
    after = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"}
    assert after == before  # summary.json, config_resolved.yaml, logs: byte for byte


# 3. two processes on one run directory raced on its files
@pytest.mark.slow
def test_a_second_process_on_a_run_directory_fails_at_once(tmp_path, base_cache):
    d = tmp_path / "run"
    first = subprocess.Popen(
        [EXE, *FAST, "steps=200", "progress=false", f"warmup.cache_dir={base_cache}", f"hydra.run.dir={d}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while not (d / "metrics.jsonl").exists():  # readiness: the first run is training (no deadline)
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        r = _cli(d, base_cache, "steps=200")
        assert r.returncode == 2 and "in use by pid" in r.stderr and str(first.pid) in r.stderr
        assert first.poll() is None  # "at once": it did not wait for the first run (200 steps) to end
    finally:
        first.kill()
        first.wait()


# 4. corrupt checkpoints / base caches loaded silently; errors named no file
def test_checksums_catch_a_changed_tensor_and_name_the_file(tmp_path):
    path = tmp_path / "blob.pt"
    save_verified(path, {"w": torch.ones(4)})
    assert torch.equal(load_verified(path)["w"], torch.ones(4))
    data = bytearray(path.read_bytes())
    data[-40] ^= 0xFF  # one byte of the payload, the file still "loads"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="blob.pt: SHA-256 mismatch"):
        load_verified(path)
    path.write_bytes(b"")  # zero-length
    with pytest.raises(CorruptFileError, match="blob.pt"):
        load_verified(path)


def test_resume_falls_back_to_the_newest_intact_checkpoint(run_exp):
    knobs = ["checkpoint.every=2", "checkpoint.keep_last=3"]
    _, full = run_exp(knobs, name="full")
    part = full.parent / "part"
    import shutil

    shutil.copytree(full, part)
    newest = part / "checkpoints" / "step_00000006.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # truncated by a crash
    (part / "summary.json").unlink()
    with pytest.warns(UserWarning, match="step_00000006.pt: SHA-256 mismatch"):
        run_exp(knobs, name="part")
    assert strip_timing(read_jsonl(part / "metrics.jsonl")) == strip_timing(read_jsonl(full / "metrics.jsonl"))


def test_a_damaged_base_cache_is_named_set_aside_and_retrained(tmp_path):
    from prorl_bench.run.trainer import train

    cfg = make_config(FAST + ["steps=2"])
    cache = tmp_path / "cache"
    train(cfg, tmp_path / "a", cache)
    base = next(p for p in cache.iterdir() if p.suffix == ".pt")
    good = base.read_bytes()
    base.write_bytes(b"")  # zero-length: used to give a bare "EOFError: "
    with pytest.warns(UserWarning, match=f"{base.name}: SHA-256 mismatch.*retraining"):
        train(cfg, tmp_path / "b", cache)
    assert base.read_bytes() == good and base.with_name(base.name + ".corrupt").exists()
    assert strip_timing(read_jsonl(tmp_path / "b" / "metrics.jsonl")) == strip_timing(
        read_jsonl(tmp_path / "a" / "metrics.jsonl")
    )


# 6. all-equal groups got |A| ~ 0.06 in float32
@pytest.mark.parametrize("name", ["grpo", "rloo", "dr_grpo"])
def test_all_equal_groups_get_exactly_zero_advantage(name):
    rewards = torch.tensor([[0.6] * 8, [1 / 3] * 8, [0.7] * 4 + [0.2] * 4])
    adv = compute_advantages(name, rewards)
    assert torch.equal(adv[:2], torch.zeros(2, 8)) and adv[2].abs().sum() > 0


# 9. resuming on another thread count silently changed the floats
def test_resume_with_another_thread_count_is_refused(run_exp, base_cache):
    from prorl_bench.run.trainer import train

    _, d = run_exp(["hardware.torch_threads=1"], name="t")
    with pytest.raises(ConfigError, match="hardware.torch_threads: 1 -> 2"):
        train(make_config(FAST + ["hardware.torch_threads=2", "steps=8"]), d, base_cache)


# 10. resuming unpickled arbitrary objects from the run directory
class _Payload:
    def __reduce__(self):
        return (Path.write_text, (Path(PLANTED), "pwned"))


PLANTED = ""


def test_a_planted_pickle_does_not_run(tmp_path):
    global PLANTED
    PLANTED = str(tmp_path / "pwned.txt")
    path = tmp_path / "checkpoints" / "step_00000001.pt"
    path.parent.mkdir()
    data = pickle.dumps({"step": 1, "x": _Payload()})
    path.write_bytes(data)
    (tmp_path / "checkpoints" / "step_00000001.pt.sha256").write_text(hashlib.sha256(data).hexdigest())
    with pytest.raises(CorruptFileError, match="step_00000001.pt: cannot be loaded safely"):
        load_verified(path)
    assert not Path(PLANTED).exists()


# 11. Preempted could not cross a process boundary (joblib: BrokenProcessPool)
def test_preempted_survives_pickling():
    e = pickle.loads(pickle.dumps(Preempted(7, 15)))
    assert isinstance(e, Preempted) and (e.step, e.signum) == (7, 15) and "SIGTERM" in str(e)


# 16. huge seeds overflowed at the first evaluation
@pytest.mark.parametrize("seed", [2**63 - 1, 1_700_000_000_000_000_000, -1])
def test_out_of_range_seeds_are_rejected(seed):
    with pytest.raises(ConfigError, match="seed"):
        make_config([f"seed={seed}"])


def test_the_largest_seed_runs(run_exp):
    summary, _ = run_exp([f"seed={2**24 - 1}", "steps=3", "growth=rank", "adapter=lora", "growth.grow_every=1"])
    assert summary["status"] == "completed"


# 15/17. temperature=1e-45 crashed in sampling; 1e30 failed the warm-up with advice about max_steps
@pytest.mark.parametrize("t", ["1e-45", "1e30", "0"])
def test_degenerate_temperatures_are_config_errors(t):
    with pytest.raises(ConfigError, match="algo.temperature"):
        make_config([f"algo.temperature={t}"])


# 5. deleted metrics rows stayed deleted under a "completed" summary
def test_resume_repairs_lost_rows_and_the_aggregator_flags_short_logs(run_exp, tmp_path):
    from prorl_bench.sweeps.sweepdir import load_run

    knobs = ["checkpoint.every=3"]
    _, full = run_exp(knobs, name="full")
    rows = (full / "metrics.jsonl").read_text().splitlines()
    (full / "metrics.jsonl").write_text("\n".join(rows[:2] + rows[4:]) + "\n")  # rows of steps 3, 4 lost
    (full / ".hydra").mkdir()
    (full / ".hydra" / "overrides.yaml").write_text("[]\n")
    run = load_run(full)
    assert run.status == "incomplete" and "4 rows but summary.json says 6" in run.error
    part = full.parent / "part"
    import shutil

    shutil.copytree(full, part)
    for p in (part / "checkpoints").glob("step_00000006*"):
        p.unlink()
    (part / "summary.json").unlink()
    run_exp(knobs, name="part")  # resumes from step 3: rows 1-3 come back from the checkpoint
    assert [json.loads(x)["step"] for x in (part / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5, 6]


# 18. re-running a completed run appended a second `end` event and overwrote wall_time_s
def test_rerunning_a_finished_run_changes_nothing_and_wall_time_adds_up(run_exp):
    summary, d = run_exp(["checkpoint.every=3"], name="r")
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"}
    again, _ = run_exp(["checkpoint.every=3"], name="r")
    assert again == json.loads((d / "summary.json").read_text())
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != ".lock"} == before
    ends = [e for e in read_jsonl(d / "events.jsonl") if e["event"] == "end"]
    assert len(ends) == 1
    # extending: the wall time is the sum over both segments, not the last one
    longer, _ = run_exp(["checkpoint.every=3", "steps=8"], name="r")
    assert longer["wall_time_s"] > summary["wall_time_s"]
    assert len([e for e in read_jsonl(d / "events.jsonl") if e["event"] == "end"]) == 1


# 15. NaN/inf weights got past the guard (parameters were never checked after the step) and then
#     failed in torch's sampler with "probability tensor contains inf"
@pytest.mark.parametrize("policy", ["fail", "skip_batch"])
def test_nonfinite_weights_after_the_step_stop_the_run_with_a_named_error(run_exp, monkeypatch, policy):
    from prorl_bench.run import setup
    from prorl_bench.run.guards import NonFiniteError

    real_build = setup.build_optimizer

    def build(policy, a):  # the RL optimizer only (the base's warm-up is left alone)
        opt = real_build(policy, a)
        real_step = opt.step

        def poisoned(*args, **kw):
            out = real_step(*args, **kw)
            with torch.no_grad():
                opt.param_groups[0]["params"][0].view(-1)[0] = float("inf")
            return out

        opt.step = poisoned
        return opt

    monkeypatch.setattr(setup, "build_optimizer", build)
    with pytest.raises(NonFiniteError, match="parameters after the optimizer step"):
        run_exp([f"guard.nonfinite={policy}"], name=policy)


def test_sampling_from_nan_weights_names_the_cause():
    from prorl_bench.config import ModelConfig
    from prorl_bench.models.model import TransformerPolicy
    from prorl_bench.models.rollout import generate
    from prorl_bench.run.guards import NonFiniteError
    from prorl_bench.tasks.base import CharTokenizer

    tok = CharTokenizer()
    pol = TransformerPolicy(ModelConfig(d_model=16, n_layers=1, n_heads=2), tok.vocab_size)
    with torch.no_grad():
        pol.lm_head.weight.fill_(float("nan"))
    ids, mask = tok.encode_prompts(["R12="])
    with pytest.raises(NonFiniteError, match="non-finite policy logits while sampling"):
        generate(pol, tok, ids, mask, 4, 1.0, generator=torch.Generator().manual_seed(0))


# 17. a malformed JSONL line failed with no file or line named; a held base-cache lock waited silently
def test_a_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not valid JSON"):
        read_jsonl(path)


def test_a_held_base_lock_is_announced_and_times_out(tmp_path):
    from prorl_bench.run.base import _base_lock

    path = tmp_path / "base.pt"
    holder = subprocess.Popen(
        [sys.executable, "-c", f"from filelock import FileLock; import time; l = FileLock({str(path) + '.lock'!r}); "
         "l.acquire(); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.warns(UserWarning, match="waiting for .*base.pt.lock"):
            with pytest.raises(TimeoutError, match="base.pt.lock still held"):
                with _base_lock(path, timeout=0.5):
                    pass
    finally:
        holder.kill()
        holder.wait()
    with _base_lock(path):  # free again: taken at once, no warning
        pass

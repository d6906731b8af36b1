"""engine=trl end to end: refusals before anything runs, the mapping table generated from the rules,
A0 and B on TRL's own trainer as mathematics (A0 = A1 bitwise with ppo_epochs x the reference
forwards; B's KL anchored at pi_old), the measured keys (kl/old, update_norm, stage timers) against
independent computations, one run directory for both engines (files, keys, resume), a grid through
the SLURM code path (submitit_local) aggregated with the same columns as a native grid, and variant B
without a reference model. Entry points are started from a temporary directory, as a user runs them."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from prorl_bench.config import to_config
from prorl_bench.engines.trl import config_map
from prorl_bench.searchpath import ROOT
from tests.conftest import compose_cfg

pytest.importorskip("trl")

BIN = Path(sys.executable).parent
HANG_S = 1800  # a hang guard only (a loaded 2-core machine), never a deadline
# a few quick steps on the tiny HF model: 4 prompts x 4 samples, 2 minibatches x 2 epochs per RL step
QUICK = ["steps=4", "eval_every=2", "algo.prompts_per_step=4", "algo.group_size=4", "task.val_size=8",
         "eval.n_samples=4", "eval.ks=[1,4]", "progress=false"]  # fmt: skip


def _cli(name: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONWARNINGS": "ignore",
                                                                         "OMP_NUM_THREADS": "1"}  # fmt: skip
    return subprocess.run([str(BIN / name), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG_S)


def _hf(model_dir: Path) -> list[str]:
    return ["model=hf_causal_lm", f"model.path={model_dir}"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from prorl_bench.models.tiny_hf import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("trl_engine") / "tiny", hidden_size=32, n_layers=2, n_heads=4)


# --------------------------------------------------------------------------- the mapping, as data


def test_every_bench_key_maps_or_is_refused():
    """Each leaf key of the schema has a rule (its own or its group's): a new key cannot slip through
    engine=trl unmapped."""
    missing = [k for k in config_map.leaf_keys() if config_map.rule_for(k) is None]
    assert missing == []


def test_docs_table_is_generated_from_the_rules():
    text = (ROOT / "docs" / "engines.md").read_text()
    assert config_map.render_table() in text, "docs/engines.md is stale: python -m prorl_bench.engines.trl.config_map"


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["variant=A2"], "variant.name"),
        (["variant=A0", "algo.beta=0"], "variant.name"),  # TRL loads no reference model at beta = 0
        (["kl_estimator=k2"], "kl_estimator.name"),
        (["kl_estimator=k1", "kl_estimator.placement=reward"], "kl_estimator.placement"),
        (["adapter=lora", "growth=rank"], "growth.kind"),
        (["kl_ctl=adaptive"], "kl_ctl.kind"),
        (["algo=rloo"], "algo.advantage"),
        (["algo.dynamic_sampling=true"], "algo.dynamic_sampling"),
        (["model.impl=fast"], "model.impl"),
        (["variant=C", "reset=periodic", "reset.source=best"], "reset.source"),
    ],
)
def test_refused_knobs_name_the_key(model_dir, overrides, key):
    with pytest.raises(Exception, match=f"engine=trl cannot run this config.*{key}"):
        to_config(compose_cfg(["engine=trl", *_hf(model_dir), *overrides]))


def test_what_trl_can_express_is_accepted(model_dir):
    base = ["engine=trl", *_hf(model_dir)]
    for extra in ([], ["variant=C", "reset=periodic", "opt_reset=hard"], ["variant=B", "algo.beta=0"],
                  ["variant=A0"], ["variant=B"], ["adapter=lora", "adapter.targets=[q_proj,v_proj]"],
                  ["algo=dr_grpo"]):  # fmt: skip
        cfg = to_config(compose_cfg(base + extra))
        assert config_map.refusals(cfg) == []
    assert cfg.algo.adv_eps == config_map.TRL_ADV_EPS  # engine=trl states TRL's hard-coded epsilon


def test_importance_weight_maps_to_trls_bias_corrected_kl(model_dir, tmp_path):
    """kl_estimator.importance_weight is TRL's use_bias_correction_kl (TRL 1.16's default True; the bench's
    False): the same term on both engines."""
    from prorl_bench.engines.trl.build import grpo_args

    for flag in (False, True):
        cfg = to_config(compose_cfg(["engine=trl", *_hf(model_dir), f"kl_estimator.importance_weight={flag}"]))
        assert config_map.refusals(cfg) == []
        assert grpo_args(cfg, tmp_path / str(flag), completion_budget=8).use_bias_correction_kl is flag


def test_refusal_fails_fast_from_the_cli(tmp_path, model_dir):
    """Exit status 2, every refused key named with its reason, and nothing written (no run directory)."""
    proc = _cli("prorl-bench", ["engine=trl", *_hf(model_dir), "variant=A2", "kl_estimator=k2",
                                "adapter=lora", "growth=rank", "kl_ctl=adaptive"], tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    for key in ("variant.name", "kl_estimator.name", "growth.kind", "kl_ctl.kind"):
        assert key in proc.stderr
    assert "no preallocated reference buffer" in proc.stderr  # the reason, not only the key
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing was written


# --------------------------------------------------------------------------- A0 and B on TRL's trainer

MB, EPOCHS, RL_STEPS = 2, 2, 2  # minibatches x PPO epochs per RL step (TRL: steps_per_generation, num_iterations)


@pytest.fixture
def one_thread():
    """Bitwise comparisons across differently grouped rows (A0's minibatch vs A1's chunk of the generation
    batch; pi_old's scoring chunk vs the loss's minibatch) hold with one intra-op thread: with two, the CPU
    matmul's blocking depends on the row count and the last bits differ (seen on a 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _bench_trainer(model_dir: Path, tmp: Path, source: str, beta: float = 0.01, mb: int = MB, epochs: int = EPOCHS,
                   lora: bool = False):  # fmt: skip
    """TRL's trainer with the bench's reference source, on a reward with spread (the sum of the
    completion's ids mod 5), 2 prompts x 4 samples per RL step, lr high enough to move the policy."""
    from datasets import Dataset
    from trl import GRPOConfig

    from prorl_bench.engines.trl.trainer import BenchGRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp / source), beta=0.0 if source == "old" else beta, max_steps=RL_STEPS * mb * epochs,
        per_device_train_batch_size=8 // mb, steps_per_generation=mb, num_generations=4, num_iterations=epochs,
        max_completion_length=6, use_cpu=True, report_to="none", learning_rate=1e-2, lr_scheduler_type="constant",
        optim="adamw_torch", gradient_checkpointing=False, bf16=False, disable_tqdm=True, logging_steps=1,
        shuffle_dataset=False, seed=0, save_strategy="no", use_bias_correction_kl=False,
    )  # fmt: skip
    prompts = Dataset.from_list([{"prompt": f"[BOS]R{i}{i + 3}="} for i in range(2 * RL_STEPS)])
    peft = None
    if lora:
        from peft import LoraConfig

        peft = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return BenchGRPOTrainer(model=str(model_dir), reward_funcs=lambda completion_ids, **_: [
        float(sum(ids) % 5) for ids in completion_ids], args=args, train_dataset=prompts, ref_source=source,
        kl_beta=beta, peft_config=peft)  # fmt: skip


def _record(trainer):
    """A TrainerCallback recording TRL's per-optimizer-step logs and the trainer's kl/old per step."""
    from transformers import TrainerCallback

    class Record(TrainerCallback):
        def __init__(self):
            self.logs, self.kl_old = [], []

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                self.logs.append(dict(logs))
                self.kl_old.append(trainer.take_step()["kl/old"])  # logging_steps=1: one optimizer step

    rec = Record()
    trainer.add_callback(rec)
    return rec


def _train(trainer):
    from prorl_bench.engines.trl.callback import unwrap
    from prorl_bench.engines.trl.rundir import RefCounter

    rec = _record(trainer)
    refs = RefCounter(unwrap(trainer.ref_model, "module") if trainer.ref_model is not None else None)
    trainer.train()
    return rec, refs


def test_a0_equals_a1_on_trl_with_ppo_epochs_times_the_reference_forwards(tmp_path, model_dir, one_thread):
    """A0 recomputes the frozen reference's log-probs in every loss computation: the same values as A1's
    one pass per generation batch, so the same losses, KL, gradients and weights (bitwise); the reference
    runs once per minibatch per epoch instead of once per minibatch-sized chunk of the batch: ppo_epochs x
    the forwards and the tokens."""
    a1 = _bench_trainer(model_dir, tmp_path, "cached")
    rec1, ref1 = _train(a1)  # built and trained in turn: a trainer seeds the global RNG when built
    a0 = _bench_trainer(model_dir, tmp_path, "recompute")
    rec0, ref0 = _train(a0)
    keys = ("loss", "kl", "grad_norm", "entropy", "clip_ratio/region_mean", "reward")
    assert len(rec1.logs) == RL_STEPS * MB * EPOCHS
    assert [[r.get(k) for k in keys] for r in rec0.logs] == [[r.get(k) for k in keys] for r in rec1.logs]
    assert any(r["kl"] > 0 for r in rec1.logs) and any(r["loss"] != 0 for r in rec1.logs)  # not a trivial run
    for (n, p0), (_, p1) in zip(a0.model.named_parameters(), a1.model.named_parameters()):
        assert torch.equal(p0, p1), n
    assert ref1.calls == RL_STEPS * MB and ref0.calls == RL_STEPS * MB * EPOCHS
    assert ref0.tokens == EPOCHS * ref1.tokens > 0


def test_a0_equals_a1_on_trl_with_a_lora_policy(tmp_path, model_dir, one_thread):
    """With PEFT, TRL's reference is the policy with its adapters disabled: A0 recomputes it inside the
    loss under TRL's own ``use_adapter``, between the policy's forwards, and still trains exactly as A1."""
    pytest.importorskip("peft")
    logs = []
    for source in ("cached", "recompute"):
        trainer = _bench_trainer(model_dir, tmp_path / source, source, lora=True)
        assert trainer.ref_model is None
        logs.append(_train(trainer)[0].logs)
    keys = ("loss", "kl", "grad_norm", "entropy")
    assert [[r[k] for k in keys] for r in logs[1]] == [[r[k] for k in keys] for r in logs[0]]
    assert any(r["kl"] > 0 for r in logs[0])


def test_b_anchors_the_kl_at_pi_old_without_a_reference_model(tmp_path, model_dir, one_thread):
    """B with beta > 0: no reference model is loaded; the KL term is k3 to pi_old (TRL's own
    old_per_token_logps). So it is 0 on each RL step's first minibatch (the policy *is* pi_old there);
    on RL step 1 pi_old is the initial policy, i.e. A1's reference: the two runs agree bitwise there."""
    b = _bench_trainer(model_dir, tmp_path, "old")
    assert b.ref_model is None
    rec_b, refs_b = _train(b)
    rec_a1, _ = _train(_bench_trainer(model_dir, tmp_path, "cached"))
    per = MB * EPOCHS
    assert [r["kl"] for r in rec_b.logs[::per]] == [0.0] * RL_STEPS
    keys = ("loss", "kl", "grad_norm", "entropy")
    assert [[r[k] for k in keys] for r in rec_b.logs[:per]] == [[r[k] for k in keys] for r in rec_a1.logs[:per]]
    assert rec_b.logs[per]["loss"] != rec_a1.logs[per]["loss"]  # step 2: pi_old moved, the reference did not
    assert refs_b.calls == 0
    # kl/old (the bench's diagnostic on TRL's own log-probs) = TRL's logged KL, which here is to pi_old
    assert rec_b.kl_old == pytest.approx([r["kl"] for r in rec_b.logs], rel=1e-5, abs=1e-7)
    assert any(v > 0 for v in rec_b.kl_old)


def test_b_with_one_minibatch_and_epoch_has_no_kl_term(tmp_path, model_dir, one_thread):
    """One minibatch, one epoch: TRL computes no pi_old (the policy is pi_old at the loss), k3 and its
    gradient are exactly 0, so B at beta > 0 trains exactly as beta = 0 (TRL's plain B)."""
    runs = []
    for beta_source in ("old", "zero"):
        trainer = _bench_trainer(model_dir, tmp_path / beta_source, "old" if beta_source == "old" else "cached",
                                 beta=0.01 if beta_source == "old" else 0.0, mb=1, epochs=1)  # fmt: skip
        runs.append(_train(trainer)[0].logs)
    keys = ("loss", "grad_norm", "entropy")
    assert [[r[k] for k in keys] for r in runs[0]] == [[r[k] for k in keys] for r in runs[1]]


def test_stage_timers_and_kl_old_are_measured(tmp_path, model_dir, one_thread):
    """Every stage TRL runs is timed around its own method: finite, >= 0, nested inside the batch's
    scoring; kl/old is 0 on each RL step's first minibatch (the policy is pi_old) and the bench's k3
    mean otherwise."""
    trainer = _bench_trainer(model_dir, tmp_path, "recompute")
    seen = []
    real = trainer.take_step

    def take():
        seen.append(real())
        return seen[-1]

    trainer.take_step = take
    rec, _ = _train(trainer)
    per = MB * EPOCHS
    assert [rec.kl_old[i] for i in range(0, len(rec.kl_old), per)] == [0.0] * RL_STEPS
    assert all(math.isfinite(v) and v >= 0 for v in rec.kl_old) and max(rec.kl_old) > 0
    firsts = seen[::per]  # the optimizer step that generated and scored the RL step's batch
    for t in firsts:
        assert all(math.isfinite(t[k]) and t[k] > 0 for k in ("rollout", "reward", "old_logprob", "score"))
        assert t["rollout"] + t["reward"] + t["old_logprob"] <= t["score"]
    assert all(t["ref_in_loss"] > 0 for t in seen)  # A0: a reference pass in every loss computation
    assert all(t["score"] == 0 for i, t in enumerate(seen) if i % per)  # later minibatches reuse the batch


def test_update_norm_is_the_rl_steps_parameter_change(tmp_path, model_dir):
    """StepMeter's update_norm = ||theta after the RL step's optimizer steps - theta before||_2, checked
    against copies taken by an independent callback; hardware.update_norm=off gives NaN."""
    from transformers import TrainerCallback

    from prorl_bench.engines.trl.meters import StepMeter

    trainer = _bench_trainer(model_dir, tmp_path, "cached")
    per = MB * EPOCHS
    meter = StepMeter(trainer.model, per)
    off = StepMeter(trainer.model, per, "off")
    norms, copies = [], []

    class Independent(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if state.global_step % per == 0:
                copies.append([p.detach().clone() for p in trainer.model.parameters()])

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % per == 0:
                diff = sum(((p.detach() - c).double() ** 2).sum() for p, c in zip(trainer.model.parameters(),
                                                                                   copies[-1]))  # fmt: skip
                norms.append((float(diff) ** 0.5, meter.take(), off.take()))

    for cb in (meter, off, Independent()):
        trainer.add_callback(cb)
    trainer.train()
    assert len(norms) == RL_STEPS
    for expected, (got, seconds), (nan, _) in norms:
        assert expected > 0 and got == pytest.approx(expected, rel=1e-9) and seconds > 0 and math.isnan(nan)


# --------------------------------------------------------------------------- one run directory contract


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_trl_run_writes_the_bench_run_directory_and_resumes(tmp_path, model_dir):
    run = tmp_path / "run"
    args = ["engine=trl", *_hf(model_dir), *QUICK, "variant=C", "reset=periodic", "reset.every=2", "opt_reset=hard",
            "checkpoint.every=2", f"run_dir={run}"]  # fmt: skip
    proc = _cli("prorl-bench", args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("config_resolved.yaml", "metrics.jsonl", "validation.jsonl", "events.jsonl", "samples.jsonl"):
        assert (run / name).is_file(), name
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    contract = {"step", "reward/mean", "reward/std", "success_rate", "kl/ref", "kl/old", "entropy", "loss/total",
                "loss/pg", "loss/kl", "clip_frac", "grad_norm", "lr", "response_len", "time/step", "time/ref_logprob",
                "count/ref_fwd", "tokens/ref_fwd", "reset"}  # fmt: skip
    assert contract <= set(rows[0])
    assert all(r["count/ref_fwd"] > 0 for r in rows)  # TRL's reference forwards, counted by hooks
    # native's measurement of the KL to the reference (run/kl_measure.reference_kl), the trigger's signal
    assert all(r["kl/ref"] >= 0 and r["kl/ref_k1"] is not None and r["kl/k2_ref_over_old"] >= 0 for r in rows)
    for r in rows:  # measured around TRL's methods (tests above check their values)
        for key in ("kl/old", "update_norm", "time/rollout", "time/reward", "time/old_logprob", "time/update"):
            assert r[key] is not None and r[key] >= 0, key
        stages = sum(r[f"time/{k}"] for k in ("rollout", "reward", "old_logprob", "ref_logprob", "update", "eval"))
        assert stages <= r["time/step"]
        assert r["loss/pg"] is None  # beta > 0: TRL logs the sum only (NaN is written as null)
    assert [r["reset"] for r in rows] == [0, 1, 0, 1]
    events = _rows(run / "events.jsonl")
    resets = [e for e in events if e["event"] == "reset"]
    assert [e["step"] for e in resets] == [2, 4] and resets[0]["opt_reset"] == "hard" and resets[0]["step_reset"]
    assert [v["step"] for v in _rows(run / "validation.jsonl")] == [0, 2, 4]  # at start, every 2, the end
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_completed"] == 4 and summary["engine"] == "trl"
    assert summary["reset_steps"] == [2, 4] and summary["mem/reference_mb"] > 0

    # resume: a copy whose last checkpoint and summary are gone continues from step 2
    again = tmp_path / "again"
    shutil.copytree(run, again)
    ckpts = sorted((again / "trl").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    shutil.rmtree(ckpts[-1])
    (again / "summary.json").unlink()
    proc = _cli("prorl-bench", [*args[:-1], f"run_dir={again}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = _rows(again / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # every step exactly once
    assert resumed[:2] == rows[:2]  # the checkpointed history is kept as written
    assert any(e["event"] == "resume" for e in _rows(again / "events.jsonl"))
    assert json.loads((again / "summary.json").read_text())["status"] == "completed"


@pytest.mark.slow
def test_variant_b_loads_no_reference_model(tmp_path, model_dir):
    """B on TRL: beta = 0, TRL builds no reference model; the summary holds 0 reference bytes and no
    reference forward is counted (A1 counts them: the test of the counter is in the run test)."""
    run = tmp_path / "b"
    proc = _cli("prorl-bench", ["engine=trl", *_hf(model_dir), *QUICK, "steps=2", "variant=B", "algo.beta=0",
                                f"run_dir={run}"], tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["mem/reference_mb"] == 0 and summary["objective"] == "trust_region_vs_old"
    rows = _rows(run / "metrics.jsonl")
    assert all(r["count/ref_fwd"] == 0 and r["kl/ref"] is None for r in rows)
    assert all(r["loss/pg"] == r["loss/total"] for r in rows)  # beta = 0, no entropy term: TRL's loss is pg


# --------------------------------------------------------------------------- grids on both engines


@pytest.mark.slow
def test_grid_on_both_engines_aggregates_to_the_same_table(tmp_path, model_dir):
    """One small grid per engine (TRL's through hydra/launcher=submitit_local: the SLURM code path),
    each aggregated by the normal aggregator: the same columns, every job completed."""
    grid = ["+arm=A1,C", "seed=0", *_hf(model_dir), *QUICK, "steps=2", "hydra.callbacks.aggregate.figures=false"]
    tables = {}
    for engine, launcher in (("trl", ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=30"]),
                             ("native", [])):  # fmt: skip
        sweep = tmp_path / engine
        proc = _cli("prorl-bench", ["-m", f"engine={engine}", *launcher, *grid, f"hydra.sweep.dir={sweep}"], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        if engine == "trl":
            assert (sweep / ".submitit").is_dir()
        tables[engine] = pd.read_csv(sweep / "aggregate" / "runs.csv")
        assert list(tables[engine]["status"]) == ["completed", "completed"]
        assert (tables[engine]["steps_logged"] == 2).all()
    assert list(tables["trl"].columns) == list(tables["native"].columns)
    assert list(tables["trl"]["group"]) == list(tables["native"]["group"])


def _table_shape(path: Path) -> list[str]:
    """table.md with every cell emptied and the sweep directory dropped: its headings, notes and the
    number of columns of each table row."""
    lines = path.read_text().splitlines()
    return ["|" * line.count("|") if line.startswith("|") else line for line in lines[1:]]


@pytest.mark.slow
def test_ablation_small_on_trl_gives_natives_tables(tmp_path, model_dir):
    """The main job's grid (A0, A1, B, C) on both engines, reduced to 2 steps and 2 + 2 seeds: every job
    runs on TRL (none refused), and the aggregate has the same files, columns and rows as native's."""
    grid = ["+sweep=ablation_small", *_hf(model_dir), *QUICK, "steps=2", "study.blocks.explore='0,1'",
            "study.blocks.confirm='2,3'", "hydra.callbacks.aggregate.figures=false"]  # fmt: skip
    agg = {}
    for engine in ("trl", "native"):
        proc = _cli("prorl-bench-sweep", [*grid, f"engine={engine}", f"hydra.sweep.dir={tmp_path / engine}"], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        agg[engine] = tmp_path / engine / "aggregate"
    runs = pd.read_csv(agg["trl"] / "runs.csv")
    assert sorted(runs["group"]) == sorted(["A0", "A1", "B", "C"] * 2) and set(runs["status"]) == {"completed"}
    for name in ("runs.csv", "groups.csv", "comparisons.csv", "seed_plan.csv"):
        trl, native = (pd.read_csv(agg[e] / name) for e in ("trl", "native"))
        assert list(trl.columns) == list(native.columns), name
        assert trl.shape == native.shape, name
        key = [c for c in ("group", "block", "metric", "seed") if c in trl.columns]
        if key:
            assert trl[key].astype(str).values.tolist() == native[key].astype(str).values.tolist(), name
    shape = {e: _table_shape(agg[e] / "table.md") for e in agg}
    assert [x.replace("engine=trl", "") for x in shape["trl"]] == [x.replace("engine=native", "") for x in
                                                                    shape["native"]]  # fmt: skip


# --------------------------------------------------------------------------- the documented TRL example


def _documented_example() -> tuple[str, str]:
    """(the shell command that builds the example's model, the example's Python) from docs/engines.md's
    ReferenceResetCallback section (its complete script, the second Python block), as a user copies them."""
    text = (ROOT / "docs" / "engines.md").read_text()
    section = text.split("## `ReferenceResetCallback` in a plain TRL script", 1)[1].split("\n## ", 1)[0]
    build = section.split("(`python -m prorl_bench.models.tiny_hf ", 1)[1].split("`", 1)[0]
    code = section.split("```python\n")[2].split("```", 1)[0]
    return build, code


@pytest.mark.slow
def test_documented_trl_example_runs_as_written(tmp_path):
    model, code = _documented_example()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    built = subprocess.run([sys.executable, "-m", "prorl_bench.models.tiny_hf", model], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=HANG_S)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (tmp_path / "example.py").write_text(code)
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_S)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 resets at RL steps [1, 2, 3, 4]" in proc.stdout


# --------------------------------------------------------------------------- past one process


@pytest.mark.slow
def test_one_trl_run_across_two_cpu_processes(tmp_path, model_dir):
    """accelerate launch --num_processes 2 --cpu: each process trains half of every minibatch (DDP over
    gloo); rank 0 alone writes the run directory, with every process's samples in each row."""
    run = tmp_path / "ddp"
    args = ["-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
            "no", "--dynamo_backend", "no", "--cpu", "-m", "prorl_bench.cli.app", "engine=trl", *_hf(model_dir),
            *QUICK, "steps=2", "variant=C", "reset=periodic", "reset.every=1", f"run_dir={run}",
            f"hydra.run.dir={tmp_path / 'hydra'}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    proc = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=HANG_S)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["reset_steps"] == [1, 2]
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # 4 prompts x 4 samples per step, gathered from both processes
        assert round(r["throughput/samples_per_s"] * r["time/step"]) == 16


# --------------------------------------------------------------------------- TRL's private surface, pinned


def _engine_sources() -> dict[str, str]:
    from prorl_bench.engines import trl as pkg

    return {p.name: p.read_text() for p in sorted(Path(pkg.__file__).parent.glob("*.py"))}


def test_the_engine_touches_only_the_private_trl_names_it_declares():
    """Every ``_``-prefixed TRL / transformers name in prorl_bench/engines/trl/ — a method of BenchGRPOTrainer
    that overrides one, or an attribute read on any object — is one of ``PRIVATE_TRL`` (named in trainer.py's
    docstring and docs/engines.md). The engine's own helpers never shadow a TRL name."""
    import ast

    from trl import GRPOTrainer

    from prorl_bench.engines.trl.trainer import PRIVATE_TRL, BenchGRPOTrainer

    used = set()
    for name, text in _engine_sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
                if not on_self or (name == "trainer.py" and hasattr(GRPOTrainer, node.attr)):
                    used.add(node.attr)
    overridden = {n for n in vars(BenchGRPOTrainer) if n.startswith("_") and not n.startswith("__")
                  and hasattr(GRPOTrainer, n)}  # fmt: skip
    assert overridden | used == set(PRIVATE_TRL), (overridden, used)
    assert overridden == {"_generate_and_score_completions"}
    own = {n for n in vars(BenchGRPOTrainer) if not n.startswith("__")} - overridden
    public = {"compute_loss", "training_step"}  # the documented Trainer methods it overrides
    assert {n for n in own if hasattr(GRPOTrainer, n)} == public


def test_the_private_trl_names_still_mean_what_the_engine_assumes():
    """Pinned against the installed TRL's source (1.16.0, the newest release checked): a TRL release that
    changes one of these fails here, not silently in a run."""
    import inspect

    from trl import GRPOTrainer

    score = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert score.count("if self.beta != 0.0:") == 1  # beta decides the per-batch reference pass, and nothing else
    assert "self.args.gradient_accumulation_steps % generate_every != 0" in score  # computes_pi_old's rule
    params = list(inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters)
    assert params[:5] == ["self", "model", "input_ids", "attention_mask", "logits_to_keep"]
    logps = inspect.getsource(GRPOTrainer._get_per_token_logps_and_entropies)
    assert "outputs.log_probs[:, -logits_to_keep:]" in logps  # kl/old reads the loss forward's log_probs
    assert "return self._compute_loss(model, inputs)" in inspect.getsource(GRPOTrainer.compute_loss)
    loss = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'ref_per_token_logps = inputs["ref_per_token_logps"]' in loss  # compute_loss's anchor reaches the loss
    assert 'old_per_token_logps = inputs.get("old_per_token_logps")' in loss


# --------------------------------------------------------------------------- the CLI around engine=trl


@pytest.mark.parametrize(
    "override,expected",
    [
        ("opt_reset=medium", "opt_reset=medium is not an option: opt_reset is one of asym, hard, keep, soft"),
        ("opt_reset=hrad", "did you mean opt_reset=hard?"),
        ("reset.every==2", "Error parsing override 'reset.every==2'"),
    ],
)
def test_hydras_config_errors_are_the_benchs_one_line_exit_2(tmp_path, model_dir, override, expected):
    proc = _cli("prorl-bench", ["engine=trl", *_hf(model_dir), "variant=C", override], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prorl-bench: config error: ") and expected in lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing was written


def test_reset_parameters_without_their_trigger_warn(model_dir):
    """variant=C reset.every=2 without reset=periodic runs no resets: the config says so (a warning naming the
    trigger to select); with the trigger selected, or left at its default, nothing is said."""
    import warnings

    from prorl_bench.config.root import UnusedOptionKeyWarning

    base = ["engine=trl", *_hf(model_dir), "variant=C"]
    with pytest.warns(UnusedOptionKeyWarning, match="reset.every=2 has no effect: reset.trigger=none.*reset=periodic"):
        to_config(compose_cfg([*base, "reset.every=2"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnusedOptionKeyWarning)
        assert to_config(compose_cfg([*base, "reset=periodic", "reset.every=2"])).reset.params.every == 2
        to_config(compose_cfg(base))


@pytest.mark.slow
def test_a_trl_run_without_reward_says_so(tmp_path, model_dir):
    """The random tiny model never earns reward: after NO_SIGNAL_STEPS RL steps the TRL run warns, on stderr
    and as an event, as the native trainer does."""
    from prorl_bench.run.diagnostics import NO_SIGNAL_STEPS

    run = tmp_path / "nosig"
    args = ["engine=trl", *_hf(model_dir), f"steps={NO_SIGNAL_STEPS}", f"eval_every={NO_SIGNAL_STEPS}",
            "algo.prompts_per_step=2", "algo.group_size=2", "algo.minibatches=1", "algo.ppo_epochs=1",
            "task.val_size=2", "eval.n_samples=1", "eval.ks=[1]", "eval.at_start=false", "progress=false",
            f"run_dir={run}", f"hydra.run.dir={tmp_path / 'hydra'}"]  # fmt: skip
    proc = _cli("prorl-bench", args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(r["reward/mean"] == 0.0 for r in _rows(run / "metrics.jsonl"))
    events = [e for e in _rows(run / "events.jsonl") if e["event"] == "warning"]
    assert [(e["step"], e["reason"]) for e in events] == [(NO_SIGNAL_STEPS, "no_reward_signal")]

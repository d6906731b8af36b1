"""``engine=trl``: one run of TRL's ``GRPOTrainer`` built from the bench's config, writing the bench's
run directory (the same files as native: config_resolved.yaml, metrics.jsonl, validation.jsonl,
events.jsonl, samples.jsonl, summary.json; checkpoints under run_dir/trl that a re-run resumes).

The same entry signature as the native trainer (``run.trainer.train``), so the CLI, sweeps, SIGTERM
handling and ``--resume`` treat both engines alike. The base policy is the bench's (the HF model of
``model.path``, after the bench's cached warm-up when enabled), so both engines start from the same
weights; the prompt stream is the bench's for the seed.
"""

from __future__ import annotations

import os
import re
import signal
from contextlib import closing, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from prorl_bench.config import Config, ConfigError, HFImpl
from prorl_bench.engines.trl.build import RewardLog, bench_reward, grpo_args, peft_config, prompt_dataset
from prorl_bench.engines.trl.callback import ReferenceResetCallback, unwrap
from prorl_bench.engines.trl.config_map import ref_source
from prorl_bench.engines.trl.rundir import BENCH_STATE, BenchRunCallback
from prorl_bench.models.hf_model import HFCausalLMPolicy
from prorl_bench.rl.resets import reset_reference
from prorl_bench.run.checkpoint import (
    config_dict,
    config_diff,
    finished_summary,
    load_verified,
    rewrite_logs,
    truncate_logs,
)
from prorl_bench.run.hardware import seed_everything, setup_hardware
from prorl_bench.run.outputs import RESOLVED_CONFIG, atomic_write_text
from prorl_bench.run.policies import build_tokenizer, load_base_policy
from prorl_bench.run.rundir import RunDirLock
from prorl_bench.run.signals import Preempted, PreemptionFlag
from prorl_bench.run.sinks import open_writer
from prorl_bench.run.summary import summarize
from prorl_bench.tasks.base import make_task

TRL_DIR = "trl"  # run_dir/trl: TRL's output_dir (its checkpoint-N directories)


def train(cfg: Config, run_dir: Path, cache_root: Path, threads: int = 1, progress: bool = False,
          resolved_config: str | None = None, stop_file: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Run one experiment on TRL; write its files into ``run_dir``; return the summary dict.

    Under ``accelerate launch`` (several processes) every process trains its share of each batch and
    applies the same resets; only rank 0 locks and writes the run directory."""
    lock = RunDirLock(run_dir) if _rank() == 0 else nullcontext()
    with lock, closing(PreemptionFlag(stop_file)) as preempt:
        return _train(cfg, Path(run_dir), cache_root, threads, progress, resolved_config, preempt)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest ``run_dir/trl/checkpoint-N`` holding the bench's state (TRL's own files beside it)."""
    found = []
    for d in (Path(run_dir) / TRL_DIR).glob("checkpoint-*"):
        m = re.fullmatch(r"checkpoint-(\d+)", d.name)
        if m and (d / BENCH_STATE).is_file():
            found.append((int(m.group(1)), d))
    return max(found)[1] if found else None


def _resume_state(cfg: Config, run_dir: Path, write: bool = True) -> tuple[Path | None, dict[str, Any]]:
    """The newest checkpoint and the bench's state in it (None, empty for a fresh run); ``write``: put
    the logs in step with it (rank 0 only)."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        if write:
            truncate_logs(run_dir, -1)
        return None, {"history": [], "val_rows": []}
    state = load_verified(ckpt / BENCH_STATE)
    diff = [d for d in config_diff(state["config"], config_dict(cfg)) if not d.startswith("steps")]
    if diff:
        raise ConfigError(f"{ckpt}: the run was made with another config ({'; '.join(diff[:5])}); "
                          "use another run_dir or the same config")  # fmt: skip
    if write:
        truncate_logs(run_dir, state["step"])
        rewrite_logs(run_dir, state["history"], state["val_rows"])
    return ckpt, state


def _train(cfg: Config, run_dir: Path, cache_root: Path, threads: int, progress: bool,
           resolved_config: str | None, preempt: PreemptionFlag) -> dict[str, Any]:  # fmt: skip
    from transformers import PrinterCallback

    from prorl_bench.engines.trl.trainer import BenchGRPOTrainer

    if (done := finished_summary(run_dir, cfg.steps)) is not None:
        return done  # re-running a finished run: nothing to do, nothing rewritten
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    device, _ = setup_hardware(cfg, threads)
    seed_everything(cfg.seed)
    cfg_hf = replace(cfg, model=replace(cfg.model, impl=HFImpl.hf))  # TRL runs the HF module itself
    tok = build_tokenizer(cfg)
    task = make_task(cfg.task)
    if cfg.algo.max_new_tokens is not None:
        task.max_completion_len = cfg.algo.max_new_tokens
    policy, base_info = load_base_policy(cfg_hf, task, tok, device, cache_root, preempt.stop_signal, progress)
    if (signum := preempt.stop_signal()) is not None:
        raise Preempted(0, signum, stage="setup")
    ckpt, state = _resume_state(cfg, run_dir, write=_rank() == 0)
    if resolved_config is not None and _rank() == 0:
        atomic_write_text(run_dir / RESOLVED_CONFIG, resolved_config)
    seed_everything(cfg.seed)
    data, problems = prompt_dataset(cfg, task, tok)
    rewards = RewardLog()
    args = grpo_args(cfg, run_dir / TRL_DIR, task.max_completion_len, processes=_processes())
    trainer = BenchGRPOTrainer(model=policy.hf, reward_funcs=bench_reward(task, tok, problems, rewards), args=args,
                               train_dataset=data, processing_class=tok.hf, peft_config=peft_config(cfg),
                               ref_source=ref_source(cfg), kl_beta=cfg.algo.beta,
                               loss_agg=cfg.algo.loss_agg)  # fmt: skip
    align_reference(trainer)
    trainer.remove_callback(PrinterCallback)  # TRL's log dicts on stdout: the bench writes metrics.jsonl
    # driven by BenchRunCallback (not one of the trainer's callbacks): it feeds each RL step's KL and the
    # bench's evaluation, and saves the callback's state with the bench's (BENCH_STATE)
    resets = ReferenceResetCallback(cfg.reset if cfg.variant.resets else None, cfg.opt_reset,
                                    lr_warmup_steps=cfg.algo.lr_warmup_steps, trainer=trainer)  # fmt: skip
    if ckpt is not None:
        resets.load_state_dict(state["resets"])
        resets.load_reference_state(state["reference"])
    view = _policy_view(trainer.model, policy)
    eval_kw = {"task": task, "tok": tok, "problems": task.val_set(), "banned": tuple(tok.banned_ids), "device": device}
    out = open_writer(cfg, run_dir) if _rank() == 0 else NullWriter()
    try:
        run = BenchRunCallback(cfg, trainer, out, resets, rewards, view, eval_kw, preempt, state)
        trainer.add_callback(run)
        if ckpt is None:
            params = sum(p.numel() for p in trainer.model.parameters())
            out.event(0, "start", "run", variant=cfg.variant.name, objective=_objective(cfg), base=base_info,
                      params=params, engine="trl")  # fmt: skip
            if cfg.eval.at_start:
                run.evaluate(0)
        else:
            out.event(state["step"], "resume", f"from checkpoint at step {state['step']}", engine="trl")
        trainer.train(resume_from_checkpoint=str(ckpt) if ckpt is not None else None)
        summary = summarize(cfg, run.history, run.val_rows, _objective(cfg), base_info, run.wall())
        if run.preempted_at is not None:
            summary["status"] = "preempted"
            out.event(run.preempted_at, "preempted", signal.Signals(preempt.signum).name)
            out.summary(summary)
            raise Preempted(run.preempted_at, preempt.signum)
        reset_at = [r["step"] for r in run.history if r["reset"]]
        held = resets.reference_bytes()
        summary |= {"engine": "trl", "resets": len(reset_at), "reset_steps": reset_at,
                    "mem/reference_mb": held / 2**20, "mem/peak_rss_mb": _peak_rss_mb()}  # fmt: skip
        out.event(cfg.steps, "end", "completed")
        out.summary(summary)
        return summary
    finally:
        out.close()


def align_reference(trainer: Any) -> None:
    """The reference starts as the policy TRL was given. TRL loads its ``ref_model`` from the model's
    directory (``config._name_or_path``), so a policy changed in memory — the bench's warm-up — would
    be trained against the directory's weights instead (a PEFT policy's reference, the base with its
    adapters disabled, is the given model already)."""
    if trainer.ref_model is not None:
        reset_reference(unwrap(trainer.ref_model, "module"), unwrap(trainer.model, "module"))


def _objective(cfg: Config) -> str:
    return "trust_region_vs_old" if cfg.variant.reference == "none" else "kl_to_reference"


class NullWriter:
    """The run writer of a process other than rank 0: it writes nothing (rank 0 writes the record)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))  # accelerate launch / torchrun set it


def _processes() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))  # accelerate launch / torchrun set it


def _policy_view(model: torch.nn.Module, policy: Any) -> Any:
    """The trained model (PEFT-wrapped or not) behind the bench's policy interface, for evaluation."""
    view = HFCausalLMPolicy(model) if model is not policy.hf else policy
    view.decode_impl, view.logits_mb = "dynamic", policy.logits_mb
    return view


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

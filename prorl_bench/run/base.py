"""The base policy RL starts from: supervised warm-up, cached on disk and shared by a sweep.

ProRL starts RL from an SFT model that already solves its tasks sometimes. We mimic that with a
teacher-forced warm-up on the task's training split that stops as soon as the policy's *sampled*
success rate (at the RL temperature) reaches ``warmup.target_success``. Stopping there leaves RL
headroom: the base is right sometimes, not always.

The checkpoint is keyed by a hash of everything that determines it (task, model, warm-up settings,
RL temperature) — not by the RL seed — so every run of a sweep starts from the identical base. A
file lock makes parallel jobs train it once: the first takes the lock and trains, the others wait
and load.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout

from prorl_bench.config import Config
from prorl_bench.models.model import TransformerPolicy
from prorl_bench.models.rollout import Rollout, token_logprobs
from prorl_bench.models.tokenizers import CharTokenizer
from prorl_bench.run.checkpoint import CorruptFileError, load_verified, save_verified
from prorl_bench.run.evaluation import evaluate
from prorl_bench.run.progress import PhaseReport
from prorl_bench.run.signals import Preempted
from prorl_bench.tasks.base import Problem, Task

BASE_FORMAT = 2  # bump when the warm-up procedure changes, so old caches are not reused


class WarmupFailed(RuntimeError):
    pass


PolicyFactory = Callable[[], torch.nn.Module]
StopCheck = Callable[[], "int | None"]  # the signal that asked the run to stop, or None


def base_key(cfg: Config, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the base depends on; ``extra`` adds e.g. a fingerprint of an HF checkpoint."""
    warm = dataclasses.asdict(cfg.warmup)
    warm.pop("cache_dir")
    warm.pop("enabled", None)
    task = dataclasses.asdict(cfg.task)
    if not task.get("params"):  # no task parameters: the key (and every cached base) is as before they existed
        task.pop("params", None)
    return json.loads(
        json.dumps(
            {
                "format": BASE_FORMAT,
                "task": task,
                "model": dataclasses.asdict(cfg.model),
                "warmup": warm,
                "temperature": cfg.algo.temperature,
                **({"extra": extra} if extra else {}),
            },
            default=lambda e: e.value,
            sort_keys=True,
        )
    )


def base_path(cfg: Config, cache_root: Path, extra: dict[str, Any] | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(base_key(cfg, extra), sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_root) / f"base-{cfg.task.name}-{digest}.pt"


def teacher_batch(tok: CharTokenizer, problems: list[Problem], device: torch.device) -> Rollout:
    """Prompt (left-padded) + demonstration + EOS (right-padded), as a Rollout for token_logprobs.
    The demonstration is the target, unless the problem carries its own ``demo`` (a task whose
    supervised data shows a behaviour RL may then amplify: hack_task.py)."""
    ids, mask = tok.encode_prompts([p.prompt for p in problems])
    targets = [tok.encode(getattr(p, "demo", None) or p.target) + [tok.EOS] for p in problems]
    width = max(len(t) for t in targets)
    comp = torch.full((len(problems), width), tok.PAD, dtype=torch.long)
    for row, t in enumerate(targets):
        comp[row, : len(t)] = torch.tensor(t)
    full = torch.cat([ids, comp], 1).to(device)
    key_mask = torch.cat([mask, torch.ones_like(comp, dtype=torch.bool)], 1).to(device)
    lengths = torch.tensor([len(t) for t in targets])
    comp_mask = (torch.arange(width)[None, :] < lengths[:, None]).float()  # not `!= PAD`: PAD may be EOS
    return Rollout(full, key_mask, ids.shape[1], comp_mask.to(device))


def native_factory(cfg: Config, tok: CharTokenizer) -> PolicyFactory:
    return lambda: TransformerPolicy(cfg.model, tok.vocab_size)


def train_base(
    cfg: Config,
    task: Task,
    tok: CharTokenizer,
    device: torch.device,
    make_policy: PolicyFactory | None = None,
    stop: StopCheck | None = None,
    progress: bool = False,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Teacher-forced warm-up until sampled success >= target. Raises WarmupFailed otherwise.

    ``make_policy`` builds the starting policy (default: a fresh native one; an HF model loads its
    pretrained weights). ``tok`` is any tokenizer with the CharTokenizer interface. ``stop()``
    returns a signal number when the run was told to stop: the warm-up then raises Preempted
    (nothing is cached; a re-run trains the same base again). The warm-up says when it starts and
    how it ended on stderr; ``progress`` adds its steps and the current success against the target
    (a bar on a terminal, a line every 10 s elsewhere: ``progress.PhaseReport``).
    """
    w = cfg.warmup
    report = PhaseReport(
        "warm-up", w.max_steps, "step", progress,
        start=f"training the base policy until its sampled success reaches {w.target_success} "
        f"(checked every {w.check_every} steps, at most {w.max_steps}); it is cached for later runs",
    )  # fmt: skip
    try:
        state, info = _warm_up(cfg, task, tok, device, make_policy, stop, report)
    except Preempted:
        report.close("stopped by a signal; nothing cached")
        raise
    except BaseException:
        report.close("failed")
        raise
    report.close(f"done after {info['warmup_steps']} steps, sampled success {info['sampled_success']:.3f}")
    return state, info


def _warm_up(cfg, task, tok, device, make_policy, stop, report: PhaseReport):
    """The warm-up loop of ``train_base``; ``report`` gets every step and each check's success."""
    w = cfg.warmup
    torch.manual_seed(w.seed)
    rng = random.Random(w.seed)
    policy = (make_policy or native_factory(cfg, tok))().to(device)
    opt = torch.optim.AdamW(policy.parameters(), lr=w.lr)
    check = task.sample_train(random.Random(w.seed + 1), w.check_size)
    gen = torch.Generator(device=device).manual_seed(w.seed)
    banned = tuple(tok.banned_ids)
    success, status = 0.0, f"success -/{w.target_success} (first check at step {w.check_every})"
    for step in range(1, w.max_steps + 1):
        if stop is not None and (signum := stop()) is not None:
            raise Preempted(0, signum, stage="warm-up")
        batch = teacher_batch(tok, task.sample_train(rng, w.batch_size), device)
        logp, _ = token_logprobs(policy, batch, 1.0, banned)
        loss = -(logp * batch.completion_mask).sum() / batch.completion_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % w.check_every == 0:
            stats = evaluate(policy, task, tok, check, cfg.algo.temperature, gen, device, greedy_too=False)
            success = stats["val/success_sampled"]
            status = f"success {success:.3f}/{w.target_success}"
            if success >= w.target_success:
                info = {"warmup_steps": step, "sampled_success": success, "loss": float(loss.detach())}
                return {k: v.detach().cpu() for k, v in policy.state_dict().items()}, info
        report.update(step, status)
    raise WarmupFailed(
        f"warm-up did not reach warmup.target_success={w.target_success} within "
        f"warmup.max_steps={w.max_steps} (last sampled success {success:.3f}); raise "
        f"warmup.max_steps or warmup.lr, or lower the target"
    )


BASE_LOCK_TIMEOUT_S = 3600.0  # a warm-up is minutes; an hour means something is wrong


@contextmanager
def _base_lock(path: Path, timeout: float | None = None):
    """The base cache's file lock: say who we wait for instead of hanging silently, and give up
    (naming the lock file) after ``timeout`` seconds (default BASE_LOCK_TIMEOUT_S)."""
    lock = FileLock(str(path) + ".lock")
    try:
        lock.acquire(timeout=5)
    except Timeout:
        warnings.warn(f"waiting for {lock.lock_file}: another process is training this base policy", stacklevel=3)
        try:
            lock.acquire(timeout=BASE_LOCK_TIMEOUT_S if timeout is None else timeout)
        except Timeout:
            raise TimeoutError(
                f"{lock.lock_file} still held after the timeout: another process is training this base "
                "(or died holding a stale lock on a network filesystem); remove the lock file if no "
                "prorl-bench process is running"
            ) from None
    try:
        yield
    finally:
        lock.release()


def load_or_train_base(
    cfg: Config,
    task: Task,
    tok: CharTokenizer,
    device: torch.device,
    cache_root: Path,
    make_policy: PolicyFactory | None = None,
    extra_key: dict[str, Any] | None = None,
    stop: StopCheck | None = None,
    progress: bool = False,
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Return the base policy (trained once per key, then loaded) and its warm-up info.
    ``progress``: see ``train_base``."""
    make_policy = make_policy or native_factory(cfg, tok)
    if getattr(task, "base_fingerprint", None):  # what else shapes the warm-up data (hack_task's demos)
        extra_key = {**(extra_key or {}), "task_data": task.base_fingerprint}
    path = base_path(cfg, cache_root, extra_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _base_lock(path):
        blob = None
        if path.exists():
            try:
                blob = load_verified(path)  # checksum + safe loading
                info = {**blob["info"], "cached": True}
            except CorruptFileError as e:
                # a cache is derived data: set the damaged file aside (kept for inspection) and
                # retrain it — deterministically the same base — rather than train from garbage
                aside = path.with_name(path.name + ".corrupt")
                os.replace(path, aside)
                warnings.warn(f"damaged base cache: {e}; moved to {aside.name} and retraining", stacklevel=2)
        if blob is None:
            # One thread, whoever trains it (a single run uses all cores, a sweep job one): float
            # reductions depend on the thread count, and the base must not depend on who came first.
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                state, info = train_base(cfg, task, tok, device, make_policy, stop, progress)
            finally:
                torch.set_num_threads(threads)
            blob = {"state_dict": state, "info": info, "key": json.dumps(base_key(cfg, extra_key))}
            save_verified(path, blob)
            info = {**info, "cached": False}
    policy = make_policy()
    policy.load_state_dict(blob["state_dict"])
    return policy.to(device), {**info, "path": str(path)}

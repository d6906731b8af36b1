"""prorl-bench vs TRL's GRPOTrainer on the same Hugging Face model, one process per side.

    python benchmarks/bench_vs_trl.py                 # builds the model, runs every side, prints the table
    python benchmarks/bench_vs_trl.py --threads 2 --steps 6 --warmup-steps 2 --repeats 2
    python benchmarks/bench_vs_trl.py --device cuda --size 0.5b --repeats 3   # a GPU, Qwen2.5-0.5B's shapes, bf16
    python benchmarks/bench_vs_trl.py --device cuda --size 0.5b --vocab char  # the same layers, 192-token vocabulary
    python benchmarks/bench_vs_trl.py --sides prorl_fast,prorl_fast@decode=dynamic  # a prorl side with other settings

Sides (each a fresh ``python benchmarks/bench_vs_trl.py --side NAME`` process, run one after another
on this machine with the same torch thread count):

* ``trl``          TRL ``GRPOTrainer`` on the model directory (needs the ``bench`` extra: trl), gradient
                   checkpointing off (identical work to prorl-bench's)
* ``trl_gc``       the same with TRL's default ``gradient_checkpointing=True`` (an extra forward in the
                   update: not identical work; not in the default ``--sides``)
* ``prorl_hf``     prorl-bench, ``model=hf_causal_lm`` on the same directory, HF module forward
* ``prorl_fast``   prorl-bench, same directory, the fast LLaMA forward (``model.impl=fast``; ``auto``'s
                   pick on CUDA)
* ``prorl_trl``    prorl-bench with ``engine=trl`` on the same directory: TRL's ``GRPOTrainer`` built from the
                   bench's config, with the bench's run-directory callback (the cost of the engine's
                   bookkeeping against ``prorl_hf``: identical work, the same HF forward)
* ``prorl_native`` prorl-bench's native policy with (about) the same parameter count (its own
                   character vocabulary: ``--vocab`` does not apply to it)

A prorl side may carry settings after ``@``: ``prorl_fast@decode=dynamic+update_norm=device+adamw=foreach``
(``hardware.decode``, ``hardware.update_norm``, ``algo.adamw_impl``; default ``auto`` for each), so the
paths this round added can be compared with the earlier ones in one interleaved run.

Identical on every side: model weights (one ``save_pretrained`` directory, built once, random init,
``--size``), prompts ("[BOS]R<6 digits>=", the reverse-digits task, same reward function),
8 prompts x 8 completions, at most 7 completion tokens, temperature 1, 2 PPO epochs (TRL
``num_iterations=2``) of 2 minibatches of 32 (TRL ``per_device_train_batch_size=32``,
``steps_per_generation=2``), beta (k3 KL to a frozen reference), clip 0.2/0.28, AdamW lr, no warm-up.
samples/s = completions generated *and trained on* per second of wall time, measured between the
ends of consecutive RL steps (TRL: every 4th optimizer step, one generation batch), after
``--warmup-steps`` untimed steps.

TRL's gradient checkpointing is off on the ``trl`` side on every device (its default is on;
prorl-bench does not checkpoint, so the work stays identical). ``--device cuda`` runs both tools with
bf16 autocast over fp32 master weights (TRL ``bf16=True``, prorl-bench ``hardware.dtype=bf16``) and
TF32. Step ends are taken after ``torch.cuda.synchronize()``. MFU is against the trainer's measured
matmul peak (``accounting.measured_matmul_peak``: bf16 8192^3 on CUDA).
``--size`` picks the model (``SIZES``): ``tiny`` (LLaMA, ~0.84M, hidden 128 x 4 layers); ``0.5b``
(Qwen2.5-0.5B's shapes: Qwen2, hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864, tied embeddings,
q/k/v biases; 0.494B parameters at its 151,936-token vocabulary; the native side d_model 1088 x 24
layers, 0.34B); ``0.48b-llama`` (the previous round's LLaMA, hidden 1280 x 24 layers, 20 heads, MLP
3456, 0.476B). ``--vocab``: ``char`` (the 192-token character WordPiece vocabulary) or a size (e.g.
151936): the same characters followed by ``[unused<i>]`` filler tokens up to that size, built offline,
so the LM head, the logits and sampling have a real LM's width while the prompts, the reward and
the completions stay the character task's (a random model samples fillers mostly: every completion
runs to its 7-token limit on every side, still identical work). Default: 151936 for ``0.5b``,
``char`` for the others.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS, GROUP, COMPLETION, EPOCHS, MINIBATCHES = 8, 8, 7, 2, 2
# --size: the HF model's family and shape, its default --vocab, and the native policy's (d_model, layers, heads)
SIZES = {
    "tiny": {"family": "llama", "hidden": 128, "layers": 4, "heads": 4, "kv_heads": 4, "mlp": 344, "tied": False,
             "vocab": "char", "native": (128, 4, 4)},
    "0.5b": {"family": "qwen2", "hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2, "mlp": 4864, "tied": True,
             "vocab": "151936", "native": (1088, 24, 17)},
    "0.48b-llama": {"family": "llama", "hidden": 1280, "layers": 24, "heads": 20, "kv_heads": 20, "mlp": 3456,
                    "tied": False, "vocab": "char", "native": (1280, 24, 20)},
}  # fmt: skip
BETA, LR, EPS_LOW, EPS_HIGH, TEMPERATURE = 0.01, 1e-3, 0.2, 0.28, 1.0
ADV_EPS = 1e-4  # TRL's hard-coded advantage denominator epsilon (engine=trl requires it; the same on every side)
DIGITS = COMPLETION - 1  # the reversed digits + EOS fill the completion budget


def reward_text(completion: str, prompt: str) -> float:
    """Reverse-digits exact match: the prompt '...R123456=' wants '654321'."""
    digits = prompt.rsplit("R", 1)[-1].rstrip("=")
    return 1.0 if completion.strip() == digits[::-1] else 0.0


# --------------------------------------------------------------------------- the model, built offline


def padded_tokenizer(vocab_size: int | None):
    """The character WordPiece tokenizer (``tiny_hf``), padded with ``[unused<i>]`` filler tokens to
    ``vocab_size`` entries (None: the 192 characters and specials only)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from prorl_bench.models.tiny_hf import SPECIALS

    chars = [chr(c) for c in range(33, 127)]
    vocab_list = list(SPECIALS) + chars + [f"##{c}" for c in chars]
    if vocab_size is not None:
        if vocab_size < len(vocab_list):
            raise SystemExit(f"--vocab {vocab_size}: at least {len(vocab_list)} (the character vocabulary)")
        vocab_list += [f"[unused{i}]" for i in range(vocab_size - len(vocab_list))]
    core = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab_list)}, unk_token="[UNK]",
                                      max_input_chars_per_word=1000))  # fmt: skip
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]"
    )


def build_model(size: str, vocab: str, path: str) -> str:
    """Save a random-weight checkpoint of ``SIZES[size]`` with ``vocab`` (``char`` or a size) to ``path``."""
    import torch
    import transformers as tf

    shape = SIZES[size]
    tok = padded_tokenizer(None if vocab == "char" else int(vocab))
    kw = dict(vocab_size=len(tok), hidden_size=shape["hidden"], intermediate_size=shape["mlp"],
              num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
              num_key_value_heads=shape["kv_heads"], max_position_embeddings=256, tie_word_embeddings=shape["tied"],
              pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    if shape["family"] == "qwen2":
        cfg, cls = tf.Qwen2Config(**kw, use_sliding_window=False), tf.Qwen2ForCausalLM
    else:
        cfg, cls = tf.LlamaConfig(**kw), tf.LlamaForCausalLM
    torch.manual_seed(0)
    model = cls(cfg)
    Path(path).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def parse_side(side: str) -> tuple[str, dict[str, str]]:
    """``prorl_fast@decode=dynamic+adamw=foreach`` -> ("prorl_fast", {"decode": "dynamic", "adamw": "foreach"})."""
    name, _, rest = side.partition("@")
    settings = dict(kv.split("=", 1) for kv in rest.split("+") if kv)
    if name not in SIDES or (settings and not name.startswith("prorl")):
        raise SystemExit(f"side {side!r}: allowed {sorted(SIDES)}, settings only on prorl sides")
    bad = sorted(set(settings) - set(SETTINGS))
    if bad:
        raise SystemExit(f"side {side!r}: unknown settings {bad}; allowed {sorted(SETTINGS)}")
    return name, settings


SIDES = ("trl", "trl_gc", "prorl_hf", "prorl_fast", "prorl_native", "prorl_trl")
SETTINGS = {"decode": "hardware.decode", "update_norm": "hardware.update_norm", "adamw": "algo.adamw_impl"}


# --------------------------------------------------------------------------- sides


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


class GpuBusy:
    """``--profile``: how much of the timed steps' wall time the GPU spends running kernels.

    ``torch.profiler`` runs from the end of the last untimed step to the end of the last but one timed;
    the sum of CUDA kernel times (one stream, so no overlap) over the wall time is the GPU's busy
    fraction. Far below 1 means the step waits on the host (Python, kernel launches), not the GPU.
    """

    def __init__(self, enabled: bool, warm: int, steps: int) -> None:
        # the last timed step is left out when there are others: prorl-bench's ends with the final evaluation
        self.enabled, self.start_at, self.stop_at = enabled, warm, warm + max(1, steps - 1)
        self.prof, self.t0 = None, 0.0
        self.result: dict = {}

    def on_step_end(self, n_ended: int) -> None:
        import torch

        if not self.enabled:
            return
        if n_ended == self.start_at:
            acts = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=acts)
            self.prof.start()
            self.t0 = time.perf_counter()
        elif n_ended == self.stop_at and self.prof is not None:
            wall = time.perf_counter() - self.t0
            self.prof.stop()
            events = self.prof.key_averages()
            # operator-level (CPU-side) events only: each kernel's time is also listed as an event of its
            # own (and under GPU-side annotations), so summing every event counts kernels twice
            ops = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
            kernels = sorted(ops, key=lambda e: e.self_device_time_total, reverse=True)
            busy = sum(e.self_device_time_total for e in ops) / 1e6
            self.result = {
                "gpu_busy_s": busy,
                "profiled_wall_s": wall,
                "gpu_busy_fraction": busy / wall,
                "ops_with_kernels": sum(e.count for e in ops if e.self_device_time_total > 0),
                "top_kernels": [(e.key[:60], e.self_device_time_total / 1e3) for e in kernels[:6]],
            }


def _cuda_mem(device: str) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None


def run_trl(
    model_dir: str,
    steps: int,
    warm: int,
    threads: int,
    device: str = "cpu",
    checkpointing: bool = False,
    profile: bool = False,
) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    rng = random.Random(0)
    prompts = ["[BOS]R" + "".join(rng.choice("0123456789") for _ in range(DIGITS)) + "=" for _ in range(4096)]
    data = Dataset.from_list([{"prompt": p} for p in prompts])

    def reward(prompts, completions, **kw):
        return [reward_text(c, p) for c, p in zip(completions, prompts)]

    per_gen = MINIBATCHES * EPOCHS  # optimizer steps per generation batch
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_bench_"),
        use_cpu=device == "cpu",
        bf16=device == "cuda",
        tf32=True if device == "cuda" else None,
        gradient_checkpointing=checkpointing,  # TRL's default is True; prorl-bench does not checkpoint
        per_device_train_batch_size=PROMPTS * GROUP // MINIBATCHES,
        steps_per_generation=MINIBATCHES,
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        num_iterations=EPOCHS,
        max_completion_length=COMPLETION,
        temperature=TEMPERATURE,
        top_p=1.0,
        top_k=0,
        beta=BETA,
        epsilon=EPS_LOW,
        epsilon_high=EPS_HIGH,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=per_gen * (warm + steps),
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
        seed=0,
    )
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    ends: list[float] = []
    busy = GpuBusy(profile, warm, steps)

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step % per_gen == 0:
                _sync(device)
                ends.append(time.perf_counter())
                busy.on_step_end(len(ends))

    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, callbacks=[Clock()]
    )
    trainer.train()
    times = [b - a for a, b in zip(ends[warm - 1 :], ends[warm:])] if warm >= 1 else []
    params = sum(p.numel() for p in model.parameters())
    return {
        "side": "trl_gc" if checkpointing else "trl",
        "step_times": times,
        "params": params,
        "cuda_max_allocated_mb": _cuda_mem(device),
        **busy.result,
    }


def run_prorl(model_dir: str, steps: int, warm: int, threads: int, impl: str | None, device: str = "cpu",
              size: str = "tiny", profile: bool = False, settings: dict[str, str] | None = None,
              engine: str = "native") -> dict:  # fmt: skip
    import torch

    from prorl_bench.config import (
        AdamWImpl,
        AlgoConfig,
        Config,
        DecodeImpl,
        Device,
        DType,
        EngineConfig,
        HardwareConfig,
        HFImpl,
        ModelConfig,
        ModelKind,
        TaskConfig,
        UpdateNormMode,
        WarmupConfig,
    )
    from prorl_bench.engines.dispatch import train
    from prorl_bench.run import outputs
    from prorl_bench.run.accounting import measured_matmul_peak

    settings = settings or {}
    torch.set_num_threads(threads)
    # the trainer's own MFU peak (bf16 8192^3 on CUDA, fp32 1024^3 on CPU): measured here, cached for the run
    peak = measured_matmul_peak(torch.device(device), torch.bfloat16 if device == "cuda" else torch.float32)
    if impl is None:
        d, layers, heads = SIZES[size]["native"]
        model = ModelConfig(kind=ModelKind.native, d_model=d, n_layers=layers, n_heads=heads, max_seq_len=32)
    else:
        model = ModelConfig(kind=ModelKind.hf_causal_lm, path=model_dir, impl=HFImpl(impl))
    cfg = Config(
        task=TaskConfig(name="reverse_digits", min_len=DIGITS, max_len=DIGITS),
        model=model,
        algo=AlgoConfig(
            prompts_per_step=PROMPTS,
            group_size=GROUP,
            ppo_epochs=EPOCHS,
            minibatches=MINIBATCHES,
            beta=BETA,
            lr=LR,
            eps_low=EPS_LOW,
            eps_high=EPS_HIGH,
            temperature=TEMPERATURE,
            adamw_impl=AdamWImpl(settings.get("adamw", "auto")),
            adv_eps=ADV_EPS,
        ),
        hardware=HardwareConfig(
            device=Device(device),
            dtype=DType.bf16 if device == "cuda" else DType.fp32,
            tf32=device == "cuda",
            torch_threads=threads,
            deterministic=False,
            decode=DecodeImpl(settings.get("decode", "auto")),
            update_norm=UpdateNormMode(settings.get("update_norm", "auto")),
        ),
        warmup=WarmupConfig(enabled=False),
        steps=warm + steps,
        eval_every=10**6,
        progress=False,
        engine=EngineConfig(name=engine),
    )
    ends: list[float] = []
    rows: list[dict] = []
    original = outputs.RunWriter.metrics

    busy = GpuBusy(profile, warm, steps)

    def clocked(self, row):  # the end of every RL step, after its metrics row is complete
        _sync(device)
        ends.append(time.perf_counter())
        busy.on_step_end(len(ends))
        rows.append(dict(row))
        return original(self, row)

    outputs.RunWriter.metrics = clocked
    with tempfile.TemporaryDirectory() as d:
        summary = train(cfg, Path(d) / "run", Path(d) / "cache", threads=threads)
    times = [b - a for a, b in zip(ends[warm - 1 :], ends[warm:])]
    timed = rows[warm:]
    stages = ("rollout", "reward", "old_logprob", "ref_logprob", "update")
    side = "prorl_native" if impl is None else ("prorl_trl" if engine == "trl" else f"prorl_{impl}")
    if settings:
        side += "@" + "+".join(f"{k}={v}" for k, v in sorted(settings.items()))
    return {
        "side": side,
        "settings": settings,
        "step_times": times,
        "params": summary["base"].get("params") if isinstance(summary.get("base"), dict) else None,
        "flops_per_step": statistics.mean(r["perf/flops"] for r in timed),
        "stage_times": {s: statistics.mean(r[f"time/{s}"] for r in timed) for s in stages},
        "response_len": statistics.mean(r["response_len"] for r in timed),
        "peak_flops": peak,
        "cuda_max_allocated_mb": _cuda_mem(device),
        **busy.result,
    }


# --------------------------------------------------------------------------- orchestration


def run_side(side: str, model_dir: str, steps: int, warm: int, threads: int, device: str, size: str,
             profile: bool = False) -> dict:  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, __file__, "--side", side, "--model-dir", model_dir, "--steps", str(steps)]
    cmd += ["--warmup-steps", str(warm), "--threads", str(threads), "--json", out, "--device", device, "--size", size]
    cmd += ["--profile"] if profile else []
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"side {side} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    res = json.loads(Path(out).read_text())
    res["process_wall_s"] = time.perf_counter() - t0
    return res


def count_params(model_dir: str) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", help="run one side in this process (SIDE[@settings])")
    ap.add_argument("--sides", default="trl,prorl_hf,prorl_fast,prorl_native")
    ap.add_argument("--model-dir", default=None, help="an HF model dir; default: build --size with --vocab")
    ap.add_argument("--steps", type=int, default=6, help="timed RL steps per side")
    ap.add_argument("--warmup-steps", type=int, default=2, help="untimed RL steps first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="run every side this many times, interleaved")
    ap.add_argument("--json", default=None)
    ap.add_argument("--results", default=None, help="write every side's raw results (JSON) here")
    ap.add_argument("--profile", action="store_true", help="GPU busy fraction of the timed steps (torch.profiler)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny", help="model size (see the module docstring)")
    ap.add_argument("--vocab", default=None, help="char | a vocabulary size, e.g. 151936 (default: the size's)")
    a = ap.parse_args()

    if a.side:  # one side, in this process
        name, settings = parse_side(a.side)
        if name in ("trl", "trl_gc"):
            res = run_trl(
                a.model_dir,
                a.steps,
                a.warmup_steps,
                a.threads,
                a.device,
                checkpointing=name == "trl_gc",
                profile=a.profile,
            )
        else:
            impl = {"prorl_hf": "hf", "prorl_fast": "fast", "prorl_native": None, "prorl_trl": "hf"}[name]
            engine = "trl" if name == "prorl_trl" else "native"
            res = run_prorl(
                a.model_dir, a.steps, a.warmup_steps, a.threads, impl, a.device, a.size, a.profile, settings, engine
            )
        Path(a.json).write_text(json.dumps(res))
        return

    sides = a.sides.split(",")
    for s in sides:
        parse_side(s)  # a typo fails before the model is built
    vocab = a.vocab or SIZES[a.size]["vocab"]
    if vocab != "char" and not vocab.isdigit():
        raise SystemExit(f"--vocab {vocab!r}: allowed char or a vocabulary size")
    model_dir = a.model_dir or build_model(a.size, vocab, tempfile.mkdtemp(prefix="bench_model_") + "/model")
    print(
        f"model: {model_dir} ({count_params(model_dir) / 1e6:.3f}M params, --size {a.size}, vocab "
        f"{vocab_size(model_dir)}), threads={a.threads}, {PROMPTS}x{GROUP} samples/step, <= {COMPLETION} "
        f"completion tokens, {EPOCHS} epochs x {MINIBATCHES} minibatches, beta={BETA}, lr={LR}, device={a.device}"
    )
    results: dict[str, list[dict]] = {s: [] for s in sides}
    for rep in range(a.repeats):  # interleaved, so background load hits every side alike
        for s in sides:
            r = run_side(s, model_dir, a.steps, a.warmup_steps, a.threads, a.device, a.size, a.profile)
            results[s].append(r)
            stages = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in r.get("stage_times", {}).items())
            print(f"  [{rep}] {s:13s} median step {statistics.median(r['step_times']) * 1e3:8.1f} ms  {stages}")
            if "gpu_busy_fraction" in r:
                busy, wall = r["gpu_busy_s"] * 1e3, r["profiled_wall_s"] * 1e3
                print(f"      GPU busy {busy:.0f} ms of {wall:.0f} ms wall ({r['gpu_busy_fraction']:.1%}), "
                      f"{r['ops_with_kernels']} operator calls ran kernels; top: {r['top_kernels'][:3]}")  # fmt: skip
            if a.results:  # after every side, so a run stopped at a time limit keeps what it measured
                Path(a.results).write_text(json.dumps(results, indent=1))
    report(results)


def vocab_size(model_dir: str) -> int:
    return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])


def report(results: dict[str, list[dict]]) -> None:
    batch = PROMPTS * GROUP

    def sps(side: str) -> float:  # best repeat's median step time: the least-disturbed measurement
        return batch / min(statistics.median(r["step_times"]) for r in results[side])

    print("\nside            samples/s   ms/step   vs TRL")
    base = sps("trl") if "trl" in results else None
    for s in results:
        v = sps(s)
        ratio = f"{v / base:6.2f}x" if base else "   -"
        print(f"{s:14s} {v:10.1f} {batch / v * 1e3:9.1f}   {ratio}")
    for s in results:
        meds = ", ".join(f"{statistics.median(r['step_times']) * 1e3:.1f}" for r in results[s])
        mems = [r["cuda_max_allocated_mb"] for r in results[s] if r.get("cuda_max_allocated_mb")]
        busy = [r["gpu_busy_fraction"] for r in results[s] if "gpu_busy_fraction" in r]
        print(f"  {s}: per-repeat median ms/step {meds}"
              + (f"; CUDA max allocated {max(mems):.0f} MiB" if mems else "")
              + (f"; GPU busy {', '.join(f'{b:.1%}' for b in busy)} of the profiled wall" if busy else ""))  # fmt: skip
    for s in results:
        if not s.startswith("prorl") or s.startswith("prorl_trl"):  # TRL reports no FLOPs or stage times
            continue
        best = min(results[s], key=lambda r: statistics.median(r["step_times"]))
        step = statistics.median(best["step_times"])
        flops, peak = best["flops_per_step"], best["peak_flops"]
        print(
            f"\n{s}: {flops / 1e9:.2f} GFLOP/step (fwd + 2x fwd for backward), achieved "
            f"{flops / step / 1e9:.2f} GFLOP/s vs measured matmul peak {peak / 1e9:.1f} GFLOP/s: "
            f"MFU {flops / step / peak:.1%}; FLOP floor {flops / peak * 1e3:.1f} ms/step "
            f"(step {step * 1e3:.1f} ms, mean completion {best['response_len']:.2f} tokens)"
        )
        if best.get("cuda_max_allocated_mb"):
            print(f"  CUDA max allocated {best['cuda_max_allocated_mb']:.0f} MiB")
        stage = best["stage_times"]
        print("  stage profile (ms): " + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in stage.items()))


if __name__ == "__main__":
    main()

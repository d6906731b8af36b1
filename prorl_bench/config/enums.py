"""The closed value sets of the config: an enum per key whose values are fixed (Hydra and OmegaConf
reject any other value with the allowed list). The pluggable axes are registry names instead (registry.py);
``RouteUse`` and ``RouteAdvantages`` live beside ``RouteConfig`` in routing.py.
"""

from __future__ import annotations

from enum import Enum


class RewardKind(str, Enum):
    exact = "exact"  # 1 if the completion equals the target, else 0
    partial = "partial"  # fraction of target positions matched (length-normalised)


class KLPlacement(str, Enum):
    loss = "loss"
    reward = "reward"


class K2Mode(str, Enum):
    theta_over_ref = "theta_over_ref"
    ref_over_old = "ref_over_old"


class LossAgg(str, Enum):
    token = "token"  # mean over all response tokens of the minibatch
    sequence = "sequence"  # mean over tokens within a sequence, then over sequences
    seq_mean_token_sum = "seq_mean_token_sum"  # verl: sum over a sequence's tokens, mean over sequences
    # Dr. GRPO: sum over all tokens / (B * completion budget: algo.max_new_tokens or the task's), as TRL
    seq_mean_token_sum_norm = "seq_mean_token_sum_norm"


class StallMetric(str, Enum):
    success_greedy = "val/success_greedy"
    success_sampled = "val/success_sampled"
    reward_mean = "val/reward_mean"


class ResetSource(str, Enum):  # reset.source (prorl_bench/rl/best.py)
    current = "current"  # the policy at the reset
    best = "best"  # the policy at the regular held-out evaluation with the highest pass@1 so far (ProRL v2)


class StepPolicy(str, Enum):
    keep = "keep"
    reset = "reset"


class KLControlKind(str, Enum):
    fixed = "fixed"
    adaptive = "adaptive"


class AdapterKind(str, Enum):
    none = "none"
    lora = "lora"
    dual_lora = "dual_lora"  # retain + forget adapters for gradient routing (prorl_bench/models/dual_lora.py)


class AdapterReferenceKind(str, Enum):
    auto = "auto"  # adapters when the base is frozen, else copy
    copy = "copy"  # a frozen deep copy of the whole policy
    adapters = "adapters"  # the policy's frozen base + the reference's own adapter weights (no copy)


class GrowthKind(str, Enum):
    none = "none"
    rank = "rank"


class Migration(str, Enum):
    preserve = "preserve"  # old slice keeps m, v by index; new slice zero; step kept
    reset = "reset"  # fresh state for the grown adapters
    naive = "naive"  # rebuild the optimizer on the new parameters: all state silently lost (baseline)


class NonFinitePolicy(str, Enum):
    fail = "fail"  # stop the run: status failed, step/stage/tensor named
    skip_batch = "skip_batch"  # skip the minibatch (or the step's update) with a counted warning


class ModelKind(str, Enum):
    native = "native"  # prorl_bench.models.model.TransformerPolicy over the character tokenizer
    hf_causal_lm = "hf_causal_lm"  # any local Hugging Face causal-LM directory (model.path)


class HFImpl(str, Enum):
    auto = "auto"  # measured: "fast" on CUDA, "hf" on CPU; LoRA targets' names can force either (hf_model._auto_impl)
    hf = "hf"  # the transformers module's own forward (any architecture)
    fast = "fast"  # prorl_bench.models.fast_llama: same weights, fused forward without HF's per-call overhead


class PromptStyle(str, Enum):
    compact = "compact"  # short prompt built from the generator's metadata (fits a char-level policy)
    question = "question"  # the generator's full natural-language question
    # the full question plus an answer-format instruction, rendered through the HF tokenizer's chat
    # template; the answer is extracted from <answer></answer> tags / "Answer:" / the last number
    chat = "chat"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"
    auto = "auto"


class DType(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


class DecodeImpl(str, Enum):  # hardware.decode (prorl_bench/models/decode.py; docs/performance.md "GPU path")
    auto = "auto"  # graph on CUDA, static on CPU (measured as fast or faster); dynamic for HF-module policies
    dynamic = "dynamic"  # rollout.generate's loop: attention over the filled prefix, a stop check per token on CPU
    static = "static"  # preallocated buffers, no host sync per token; bit-identical to dynamic
    graph = "graph"  # static shapes (whole-buffer attention), the step captured as a CUDA graph on CUDA


class UpdateNormMode(str, Enum):  # hardware.update_norm (prorl_bench/rl/optim.py)
    auto = "auto"  # device on CPU, host on CUDA (the GPU memory of a weight copy is the scarce one)
    device = "device"  # copy the trainable weights on their device before the update (exact)
    host = "host"  # copy them to host memory, compare tensor by tensor after the update (exact, same value)
    off = "off"  # no copy; update_norm is logged as NaN


class AdamWImpl(str, Enum):  # algo.adamw_impl (prorl_bench/rl/optim.py)
    auto = "auto"  # fused on CUDA; foreach on CPU (keeps CPU trajectories bit-identical to earlier releases)
    foreach = "foreach"  # torch's multi-tensor AdamW
    fused = "fused"  # torch's fused AdamW kernel (CUDA; CPU too since torch 2.4)

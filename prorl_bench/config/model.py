"""``model``, ``adapter``, ``hardware`` and ``warmup``: the policy, its adapters, where it runs and
the supervised warm-up that produces its base."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prorl_bench import registry
from prorl_bench.config.enums import (
    AdapterKind,
    AdapterReferenceKind,
    DecodeImpl,
    Device,
    DType,
    HFImpl,
    ModelKind,
    UpdateNormMode,
)
from prorl_bench.config.options import bind_params

_require = registry.require  # ConfigError "invalid config value key=value: allowed ..." unless ok


POSITIONS = ("learned", "answer", "rope")  # model.positions (prorl_bench/models/model.py says why each)


@dataclass
class ModelConfig:
    """``kind=native`` uses d_model..max_seq_len. ``kind=hf_causal_lm`` loads ``path`` (a local
    directory with config.json, weights and tokenizer; nothing is downloaded) and ignores the native
    size fields; ``impl`` picks the forward implementation (see HFImpl)."""

    kind: ModelKind = ModelKind.native  # native (char-level TransformerPolicy) | hf_causal_lm (a local HF directory)
    d_model: int = 64  # native: residual width
    n_layers: int = 2  # native: transformer blocks
    n_heads: int = 4  # native: attention heads (divides d_model)
    dropout: float = 0.0  # native: dropout probability (0 keeps RL deterministic)
    max_seq_len: int = 64  # native: context length in tokens (prompt + completion + BOS)
    # schema default (Python API); a composed run takes its regime's (conf/regime/v2.yaml: answer)
    positions: str = "learned"  # native: learned (from the row start) | answer (from the answer start) | rope
    path: str | None = None  # hf_causal_lm: local model directory (config.json, weights, tokenizer)
    impl: HFImpl = HFImpl.auto  # hf_causal_lm forward: auto | hf | fast (see HFImpl)

    def __post_init__(self) -> None:
        if self.kind == ModelKind.hf_causal_lm:
            _check_hf_path(self.path)
        _require(self.d_model >= 8, "model.d_model", self.d_model, ">= 8")
        _require(self.n_layers >= 1, "model.n_layers", self.n_layers, ">= 1")
        _require(self.n_heads >= 1, "model.n_heads", self.n_heads, ">= 1")
        _require(
            self.d_model % self.n_heads == 0,
            "model.n_heads",
            self.n_heads,
            f"a divisor of model.d_model ({self.d_model})",
        )
        _require(0.0 <= self.dropout < 1.0, "model.dropout", self.dropout, "in [0, 1)")
        _require(self.max_seq_len >= 8, "model.max_seq_len", self.max_seq_len, ">= 8")
        _require(self.positions in POSITIONS, "model.positions", self.positions, ", ".join(POSITIONS))
        _require(
            self.positions == "learned" or (self.d_model // self.n_heads) % 2 == 0,
            "model.positions",
            self.positions,
            "learned when the head dimension (d_model / n_heads) is odd",
        )


def _check_hf_path(path: str | None) -> None:
    allowed = "a local Hugging Face model directory containing config.json (nothing is downloaded)"
    _require(path is not None and str(path) != "", "model.path", path, allowed)
    from pathlib import Path

    p = Path(str(path)).expanduser()
    _require(p.is_dir(), "model.path", path, allowed + f"; {p} does not exist or is not a directory")
    _require((p / "config.json").is_file(), "model.path", path, allowed + f"; {p} has no config.json")


@dataclass
class LoraParams:
    """``adapter=lora``: LoRA adapters (Hu et al. 2021) on the policy's linear layers named in ``targets``."""

    rank: int = 4  # LoRA rank r (Hu et al. 2021)
    alpha: float = 8.0  # scaling = alpha / initial rank, kept fixed when the rank grows
    # linear layers that get adapters (attribute names: qkv, proj, fc1, fc2 native; q_proj... HF)
    targets: list[str] = field(default_factory=lambda: ["qkv", "proj", "fc1", "fc2"])
    freeze_base: bool = True  # train only the adapters (the base is frozen)
    # How the reference model is held (variants with a reference): ``adapters`` shares the frozen
    # base with the policy and keeps only a copy of the adapter weights (TRL disables a PEFT
    # adapter for the same purpose); trajectories equal the deep copy's bit for bit (tested).
    reference: AdapterReferenceKind = AdapterReferenceKind.auto

    def __post_init__(self) -> None:
        _require(self.rank >= 1, "adapter.rank", self.rank, ">= 1")
        _check_shared(self)
        _require(
            not (self.reference == AdapterReferenceKind.adapters and not self.freeze_base),
            "adapter.reference",
            self.reference.value,
            "copy or auto when adapter.freeze_base=false (the base trains, so the reference needs its own copy)",
        )


@dataclass
class DualLoraParams:
    """``adapter=dual_lora``: gradient routing's retain and forget LoRA adapters on the same layers
    (prorl_bench/models/dual_lora.py); each adapter's scaling is alpha / its rank."""

    retain_rank: int = 4  # rank of the retain adapter (learns from unlabelled samples only)
    forget_rank: int = 4  # rank of the forget adapter (learns from every sample)
    alpha: float = 8.0  # each adapter's scaling is alpha / its rank
    # linear layers that get both adapters (attribute names: qkv, proj, fc1, fc2 native; q_proj... HF)
    targets: list[str] = field(default_factory=lambda: ["qkv", "proj", "fc1", "fc2"])
    freeze_base: bool = True  # train only the adapters (the base is frozen)
    # copy | auto: the reference is a frozen copy of the policy (``adapters`` is lora's sharing, refused here)
    reference: AdapterReferenceKind = AdapterReferenceKind.auto

    def __post_init__(self) -> None:
        _require(self.retain_rank >= 1, "adapter.retain_rank", self.retain_rank, ">= 1")
        _require(self.forget_rank >= 1, "adapter.forget_rank", self.forget_rank, ">= 1")
        _check_shared(self)
        _require(
            self.reference != AdapterReferenceKind.adapters,
            "adapter.reference",
            self.reference.value,
            "copy or auto with adapter=dual_lora (its reference is a frozen copy of the policy)",
        )


def _check_shared(p: LoraParams | DualLoraParams) -> None:
    _require(p.alpha > 0, "adapter.alpha", p.alpha, "> 0")
    _require(len(p.targets) > 0, "adapter.targets", p.targets, "a non-empty list of layer names")


@dataclass
class AdapterConfig:
    """Adapters on the policy: ``none`` (full fine-tuning), ``lora`` or ``dual_lora`` (their parameters:
    ``LoraParams``, ``DualLoraParams``, flat keys ``adapter.<key>``)."""

    kind: AdapterKind = AdapterKind.none  # none | lora | dual_lora
    params: Any = None  # the kind's parameters (flat keys adapter.<key>)

    def __post_init__(self) -> None:
        self.params = bind_params(registry.ADAPTERS, self.kind, self.params)  # an unknown name: ConfigError
        self.kind = AdapterKind(self.kind)  # a name given as text (Python API) is the enum member


@dataclass
class HardwareConfig:
    device: Device = Device.cpu  # cpu | cuda | auto
    # null: a single run uses the CPUs it may run on (affinity), capped by OMP_NUM_THREADS; 1 per multirun job
    torch_threads: int | None = None
    dtype: DType = DType.fp32  # fp32 | bf16 (bf16 autocast on CUDA only)
    deterministic: bool = True  # torch.use_deterministic_algorithms (warn_only)
    tf32: bool = False  # allow TF32 matmuls on CUDA
    peak_flops: float | None = None  # FLOP/s for MFU; None = measure a matmul peak once
    decode: DecodeImpl = DecodeImpl.auto  # sampling loop: auto | dynamic | static | graph (see DecodeImpl)
    update_norm: UpdateNormMode = UpdateNormMode.auto  # where the update_norm snapshot lives (see UpdateNormMode)
    logits_mb: float = 256.0  # log-prob passes run the LM head on position chunks of <= this many MiB of fp32 logits

    def __post_init__(self) -> None:
        _require(
            self.torch_threads is None or self.torch_threads >= 1,
            "hardware.torch_threads",
            self.torch_threads,
            "null or >= 1",
        )
        _require(
            self.peak_flops is None or self.peak_flops > 0,
            "hardware.peak_flops",
            self.peak_flops,
            "null or > 0",
        )
        _require(self.logits_mb > 0, "hardware.logits_mb", self.logits_mb, "> 0")
        _require(
            not (self.device == Device.cpu and self.dtype == DType.bf16),
            "hardware.dtype",
            self.dtype.value,
            "fp32 on device=cpu (bf16 autocast is a CUDA path)",
        )


@dataclass
class WarmupConfig:
    """Supervised warm-up that produces the base policy RL starts from (as ProRL starts from SFT).

    Warm-up stops as soon as the base's *sampled* success rate on held-out problems reaches
    ``target_success`` — leaving RL headroom above it. The base is cached on disk, keyed by
    everything that determines it (task, model, this section), and shared by every run of a sweep.
    """

    target_success: float = 0.2  # stop warm-up when sampled held-out success reaches this
    max_steps: int = 3000  # warm-up step limit (error if the target is not reached)
    batch_size: int = 64  # warm-up problems per supervised step
    lr: float = 3e-3  # warm-up AdamW learning rate
    check_every: int = 10  # warm-up steps between success checks
    check_size: int = 128  # held-out problems per success check
    seed: int = 0  # warm-up seed (part of the base cache key; per-seed bases: set it to the run seed)
    cache_dir: str = "outputs/base_cache"  # relative paths resolve against the launch directory
    # null: warm up native policies, not Hugging Face ones (a pretrained LM is already a base).
    # true on an HF model fine-tunes it on the task first (cached the same way); false skips it.
    enabled: bool | None = None

    def __post_init__(self) -> None:
        _require(0.0 < self.target_success <= 1.0, "warmup.target_success", self.target_success, "in (0, 1]")
        _require(self.max_steps >= 1, "warmup.max_steps", self.max_steps, ">= 1")
        _require(self.batch_size >= 1, "warmup.batch_size", self.batch_size, ">= 1")
        _require(self.lr > 0, "warmup.lr", self.lr, "> 0")
        _require(self.check_every >= 1, "warmup.check_every", self.check_every, ">= 1")
        _require(self.check_size >= 1, "warmup.check_size", self.check_size, ">= 1")

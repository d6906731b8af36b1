"""The run's hardware: the device, the autocast context and precision, determinism and thread
count, and the seeding of the global generators."""

from __future__ import annotations

import random
import sys
from contextlib import nullcontext
from typing import Any

import torch

from prorl_bench.config import Config, ConfigError, Device, DType


def resolve_device(cfg: Config) -> torch.device:
    want = cfg.hardware.device
    if want == Device.auto:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if want == Device.cuda and not torch.cuda.is_available():
        raise ConfigError("hardware.device=cuda but no CUDA device is available; allowed here: cpu, auto")
    return torch.device(want.value)


def use_deterministic_algorithms(mode: bool) -> None:
    """``torch.use_deterministic_algorithms(mode, warn_only=True)`` without its import of
    ``torch._inductor`` (about 3 s per process, paid by every run and every sweep worker) only to set
    the compiler's flag: nothing here compiles, so unless inductor is loaded already the eager flag is
    all there is to set."""
    if "torch._inductor.config" in sys.modules or not hasattr(torch._C, "_set_deterministic_algorithms"):
        torch.use_deterministic_algorithms(mode, warn_only=True)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=True)


def setup_hardware(cfg: Config, threads: int) -> tuple[torch.device, Any]:
    """The device and the autocast context of the forward passes (bf16 only on CUDA)."""
    torch.set_num_threads(threads)
    device = resolve_device(cfg)
    use_deterministic_algorithms(cfg.hardware.deterministic)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.hardware.tf32
        torch.backends.cudnn.allow_tf32 = cfg.hardware.tf32
    bf16 = matmul_dtype(cfg, device) == torch.bfloat16
    return device, torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else nullcontext()


def matmul_dtype(cfg: Config, device: torch.device) -> torch.dtype:
    """The precision the run's matmuls use: bf16 (autocast) only on CUDA; ``auto`` on a CPU-only host
    and every CPU run: fp32."""
    return torch.bfloat16 if cfg.hardware.dtype == DType.bf16 and device.type == "cuda" else torch.float32


def seed_everything(seed: int) -> None:
    """Seed every global generator: loky reuses worker processes across sweep jobs."""
    random.seed(seed)
    torch.manual_seed(seed)

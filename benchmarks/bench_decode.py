"""The decode paths of ``rollout.generate`` (``hardware.decode``), timed alternately on the same inputs.

    python benchmarks/bench_decode.py --threads 1 --repeats 40            # CPU: dynamic vs static vs graph form
    python benchmarks/bench_decode.py --device cuda --d-model 1024 --layers 24 --repeats 20

Every repeat generates ``--rows`` completions of ``--tokens`` tokens with each impl in turn (same
prompts, same generator seed), after one untimed call each (a CUDA graph is captured there). It also
prints how often SDPA over a zero-padded, masked key buffer (the graph form's attention) differs in
any bit from SDPA over the filled prefix (the dynamic path's), on random decode steps: why ``graph``
equals ``dynamic`` to rounding only (decode.py).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from prorl_bench.config import ModelConfig
from prorl_bench.models.model import TransformerPolicy
from prorl_bench.models.rollout import generate
from prorl_bench.models.tokenizers import CharTokenizer


def sdpa_padding_differences(trials: int = 200, seed: int = 0) -> int:
    """Random (B=8, H=2, Dh=16) decode steps: prefix attention vs the same keys zero-padded and masked."""
    g = torch.Generator().manual_seed(seed)
    differ = 0
    for _ in range(trials):
        n = int(torch.randint(2, 60, (), generator=g))
        cap = n + int(torch.randint(1, 40, (), generator=g))
        q = torch.randn(8, 2, 1, 16, generator=g)
        k, v = torch.randn(8, 2, cap, 16, generator=g), torch.randn(8, 2, cap, 16, generator=g)
        k[:, :, n:] = 0
        v[:, :, n:] = 0
        mask = torch.rand(8, cap, generator=g) > 0.2
        mask[:, n - 1] = True
        mask[:, n:] = False
        prefix = F.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n], attn_mask=mask[:, None, None, :n])
        padded = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        differ += not torch.equal(prefix, padded)
    return differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--impls", default="dynamic,static,graph")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    tok = CharTokenizer()
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=a.d_model, n_layers=a.layers, n_heads=max(1, a.d_model // 64), max_seq_len=64)
    pol = TransformerPolicy(cfg, tok.vocab_size).to(dev).eval()
    ids, mask = tok.encode_prompts(["R123456="] * a.rows)
    ids, mask = ids.to(dev), mask.to(dev)
    impls = a.impls.split(",")
    times: dict[str, list[float]] = {i: [] for i in impls}

    def once(impl: str, seed: int) -> None:
        gen = torch.Generator(device=dev).manual_seed(seed)
        generate(pol, tok, ids, mask, a.tokens, 1.0, generator=gen, impl=impl)
        if dev.type == "cuda":
            torch.cuda.synchronize()

    with torch.no_grad():
        for impl in impls:
            once(impl, 0)  # untimed: allocation, graph capture
        for rep in range(a.repeats):
            for impl in impls:
                t0 = time.perf_counter()
                once(impl, rep)
                times[impl].append(time.perf_counter() - t0)
    print(f"{a.rows} rows x {a.tokens} tokens, d_model {a.d_model} x {a.layers} layers, {a.device}, "
          f"{a.threads} thread(s), {a.repeats} alternating repeats")  # fmt: skip
    for impl, ts in times.items():
        print(f"  {impl:8s} median {statistics.median(ts) * 1e3:8.2f} ms   best {min(ts) * 1e3:8.2f} ms")
    print(f"SDPA prefix vs padded buffer: {sdpa_padding_differences()} of 200 random decode steps differ in some bit")


if __name__ == "__main__":
    main()

"""The fast LLaMA forward vs HF's module forward, in one process, interleaved (what ``model.impl=auto`` picks).

    python benchmarks/bench_impl.py --threads 2 --repeats 15

For each model size (a locally built random LLaMA checkpoint, ``prorl_bench/models/tiny_hf.py``) both
implementations are loaded from the same directory and timed alternately on the same inputs, so
background load hits both alike (separate processes, as in ``bench_vs_trl.py``, differ by more than
the effect: the measured matmul peak itself varied 15% between processes). Timed, per call:

* ``update``: forward + backward of a (32, 20) batch with the loss-side logits of the last 8
  positions (the shape of one update minibatch: 2/3 of an RL step's time);
* ``score``: a no-grad forward of (64, 20) (old / reference logprobs);
* ``decode``: prefill of (64, 13) then 7 cached single-token steps (the rollout).

Prints the median ms of each over ``--repeats`` alternations and the ratio fast / hf (< 1: the fast
path is faster). Logits are checked equal (1e-4) before timing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

SIZES = {"0.84M": dict(hidden_size=128, n_layers=4), "10.8M": dict(hidden_size=384, n_layers=6)}


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def bench(model_dir: str, repeats: int) -> dict[str, dict[str, float]]:
    from prorl_bench.config import HFImpl, ModelConfig, ModelKind
    from prorl_bench.models.hf_model import load_policy
    from prorl_bench.models.model import positions

    cpu = torch.device("cpu")
    policies = {
        impl.value: load_policy(ModelConfig(kind=ModelKind.hf_causal_lm, path=model_dir, impl=impl), cpu)
        for impl in (HFImpl.hf, HFImpl.fast)
    }
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 190, (64, 20), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        ref = policies["hf"](ids, mask)
        torch.testing.assert_close(policies["fast"](ids, mask), ref, rtol=1e-4, atol=1e-4)

    def update(p):
        p.zero_grad(set_to_none=True)
        p(ids[:32], mask[:32], keep=9).float().logsumexp(-1).mean().backward()

    def score(p):
        with torch.no_grad():
            p(ids, mask, keep=9)

    def decode(p):
        with torch.no_grad():
            cache = p.new_cache(64, 20, cpu)
            pm = mask[:, :13]
            logits = p.forward_cached(ids[:, :13], pm, positions(pm), cache)[:, -1]
            pos = pm.long().sum(-1, keepdim=True)
            ones = torch.ones(64, 1, dtype=torch.bool)
            for _ in range(7):
                logits = p.forward_cached(logits.argmax(-1)[:, None], ones, pos, cache)[:, -1]
                pos = pos + 1

    out: dict[str, dict[str, float]] = {}
    for name, fn in (("update", update), ("score", score), ("decode", decode)):
        times: dict[str, list[float]] = {k: [] for k in policies}
        for p in policies.values():  # one untimed call each
            fn(p)
        for _ in range(repeats):
            for k, p in policies.items():
                times[k].append(_timed(lambda p=p, fn=fn: fn(p)))
        out[name] = {k: statistics.median(v) for k, v in times.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated subset of {list(SIZES)}")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from prorl_bench.models.tiny_hf import build_tiny_llama

    print(f"threads={a.threads}, repeats={a.repeats} (median ms per call; ratio fast/hf < 1: fast is faster)")
    print(f"{'model':8s} {'call':7s} {'hf ms':>9s} {'fast ms':>9s} {'fast/hf':>8s}")
    for size in a.sizes.split(","):
        d = build_tiny_llama(tempfile.mkdtemp(prefix="bench_impl_") + "/model", **SIZES[size])
        for call, t in bench(str(d), a.repeats).items():
            print(f"{size:8s} {call:7s} {t['hf']:9.2f} {t['fast']:9.2f} {t['fast'] / t['hf']:8.3f}")


if __name__ == "__main__":
    main()

"""Where a bench side's memory goes, on CPU, in units of parameter-sized copies (issue 38).

    python benchmarks/memory_census.py census --side prorl_fast   # live tensors at an optimizer step, by holder
    python benchmarks/memory_census.py decode --rows 512          # one validation batch's transient per decode path

``census`` runs one side of ``bench_vs_trl.py`` (same config, ``--size tiny``) for 2 untimed + 2 timed
RL steps and, right after its 6th optimizer step, groups every live CPU tensor by storage: the
trained parameters, their gradients, AdamW's ``exp_avg`` / ``exp_avg_sq``, the parameters of every
other top-level ``nn.Module`` (a reference model), tensors shaped like a parameter held elsewhere (a
snapshot), and the rest. Each group is printed in parameter-sized copies (its bytes / the trained
parameters' bytes), so the count carries over to the 0.5B model on a GPU.

``decode`` measures, with a dispatch-mode probe, the peak bytes of the storages created while one batch
of ``--rows`` prompts ("[BOS]R123456=", 9 tokens) is decoded for 7 tokens (fp32, no autocast) by the
fast LLaMA policy (static and dynamic decode) and by the HF module policy (dynamic), and the largest
tensor any op made. These transients scale with rows x vocabulary, not with the hidden size.
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
import tempfile
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
import bench_vs_trl as bench  # noqa: E402

MIB = 2**20


def census(opt: torch.optim.Optimizer) -> dict[str, float]:
    """Live CPU storages right now, grouped by holder, in units of the optimizer's parameters' bytes."""
    params = [p for g in opt.param_groups for p in g["params"]]
    unit = sum(p.numel() * p.element_size() for p in params)
    shapes = {tuple(p.shape) for p in params}
    role: dict[int, str] = {}
    for p in params:
        role[p.untyped_storage().data_ptr()] = "policy parameters"
        if p.grad is not None:
            role[p.grad.untyped_storage().data_ptr()] = "gradients"
    for st in opt.state.values():
        for k, v in st.items():
            if torch.is_tensor(v) and v.numel() > 1:
                role[v.untyped_storage().data_ptr()] = f"AdamW {k}"
    gc.collect()
    objs = gc.get_objects()
    mods = [o for o in objs if isinstance(o, torch.nn.Module)]
    children = {id(c) for m in mods for c in m.children()}
    for m in mods:  # every other top-level module's weights (a reference model, a base model)
        if id(m) not in children:
            for t in [*m.parameters(), *m.buffers()]:
                role.setdefault(t.untyped_storage().data_ptr(), f"module {type(m).__name__}")
    groups: collections.Counter = collections.Counter()
    seen: set[int] = set()
    for o in objs:
        if not isinstance(o, torch.Tensor) or o.is_meta or o.device.type != "cpu":
            continue
        st = o.untyped_storage()
        if st.data_ptr() in seen:
            continue
        seen.add(st.data_ptr())
        default = "parameter-shaped, held elsewhere" if tuple(o.shape) in shapes else "other"
        groups[role.get(st.data_ptr(), default)] += st.nbytes()
    return {k: v / unit for k, v in groups.most_common()} | {"unit_mib": unit / MIB}


def run_census(side: str, at_step: int = 6) -> dict[str, float]:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    found: dict[str, float] = {}
    calls = [0]

    def hook(opt, args, kwargs):
        calls[0] += 1
        if calls[0] == at_step:
            found.update(census(opt))

    register_optimizer_step_post_hook(hook)
    model_dir = bench.build_model("tiny", "char", tempfile.mkdtemp(prefix="census_") + "/model")
    name, settings = bench.parse_side(side)
    if name in ("trl", "trl_gc"):
        bench.run_trl(model_dir, 2, 2, 1, "cpu", checkpointing=name == "trl_gc")
    else:
        impl = {"prorl_hf": "hf", "prorl_fast": "fast", "prorl_native": None, "prorl_trl": "hf"}[name]
        engine = "trl" if name == "prorl_trl" else "native"
        bench.run_prorl(model_dir, 2, 2, 1, impl, "cpu", "tiny", False, settings, engine)
    if not found:
        raise SystemExit(f"side {side}: fewer than {at_step} optimizer steps ran")
    return found


class TransientPeak(TorchDispatchMode):
    """Peak bytes of the storages ops create while active (freed when torch frees them), and the
    largest one; storages that existed before (weights, inputs) are not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.tracked: set[int] = set()
        self.largest: tuple[int, str] = (0, "")

    def _free(self, key: int, nbytes: int) -> None:
        self.tracked.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat = [*args, *(kwargs or {}).values()]
        inputs = {a.untyped_storage().data_ptr() for a in flat if isinstance(a, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            if st.data_ptr() in inputs or id(st) in self.tracked:  # in place or a view
                continue
            self.tracked.add(id(st))
            self.live += st.nbytes()
            self.largest = max(self.largest, (st.nbytes(), f"{func.__name__} {tuple(t.shape)}"))
            weakref.finalize(st, self._free, id(st), st.nbytes())
        self.peak = max(self.peak, self.live)
        return out


def run_decode(rows: int, vocab: int) -> None:
    from transformers import AutoTokenizer

    from prorl_bench.config import HFImpl, ModelConfig, ModelKind
    from prorl_bench.models.hf_model import HFTokenizer, load_policy
    from prorl_bench.models.rollout import generate

    path = bench.build_model("tiny", str(vocab), tempfile.mkdtemp(prefix="census_") + "/model")
    tok = HFTokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True))
    ids, mask = tok.encode_prompts(["R123456="] * rows)
    print(f"{rows} prompts x {ids.shape[1]} tokens, 7 new tokens, vocabulary {vocab}, fp32")
    for impl, decode in (("fast", "static"), ("fast", "dynamic"), ("hf", "dynamic")):
        policy = load_policy(
            ModelConfig(kind=ModelKind.hf_causal_lm, path=path, impl=HFImpl(impl)), torch.device("cpu")
        )
        with torch.no_grad(), TransientPeak() as probe:
            generate(policy, tok, ids, mask, 7, 1.0, generator=torch.Generator().manual_seed(0), impl=decode)
        print(f"  {impl:4s} {decode:7s}: peak transient {probe.peak / MIB:8.1f} MiB; largest "
              f"{probe.largest[0] / MIB:.1f} MiB ({probe.largest[1]})")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("census", help="live tensors at an optimizer step, in parameter-sized copies")
    c.add_argument("--side", default="prorl_fast", help="a bench_vs_trl side, e.g. trl, prorl_fast, prorl_trl")
    d = sub.add_parser("decode", help="one decode batch's transient memory per decode path")
    d.add_argument("--rows", type=int, default=512)
    d.add_argument("--vocab", type=int, default=151_936)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.cmd == "census":
        res = run_census(a.side)
        unit = res.pop("unit_mib")
        print(f"{a.side}: at the 6th optimizer step, in copies of the trained parameters ({unit:.2f} MiB):")
        for k, v in res.items():
            print(f"  {v:6.3f}  {k}")
        print(f"  {sum(res.values()):6.3f}  total")
    else:
        run_decode(a.rows, a.vocab)


if __name__ == "__main__":
    main()

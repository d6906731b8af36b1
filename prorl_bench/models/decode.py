"""Decoding without per-token host work (``hardware.decode=static|graph``).

``rollout.generate``'s dynamic path grows the attention length by one every token, reads
``torch.multinomial`` (which checks its input with two ``.item()`` host syncs per call) and decides
after every token whether to stop. This path keeps every shape fixed instead:

* a KV cache preallocated to ``capacity >= prompt + max_new_tokens`` positions; a decode step writes
  its keys/values at a device-side index and attends over the whole buffer, the key mask hiding the
  positions not written yet (``KVCache.append`` / ``decode_step`` of the native and fast policies);
* the sampler is ``torch.multinomial``'s own one-sample algorithm (``argmax(p / q)``, ``q ~ Exp(1)``
  drawn with ``exponential_`` from the same generator) without its host-side checks: the same tokens
  and the same generator state as ``torch.multinomial`` (tests/models/test_decode.py checks both bit for
  bit); invalid probabilities set a device flag that is read at the next stop check and raises
  ``NonFiniteError`` as the dynamic path does;
* whether every row has ended is read on the host only every ``check_every`` tokens (1 on CPU,
  where a read costs nothing, 8 on CUDA as the dynamic path does): between two checks the step only
  replays, so on CUDA the decode step (the forward of one token and the sampling of the next) is
  captured once as a CUDA graph (``graph=True``) and replayed per token: one launch instead of
  ~25 kernels per layer.

Exactness on CPU. With ``graph=False`` the step reads only the filled prefix of the cache (its length
is a host int, as in the dynamic path), so the whole computation is the dynamic path's, op for op:
ids, completion masks and the generator state are bit-identical (tested), and ``hardware.decode=static``
leaves every CPU trajectory unchanged. The whole-buffer attention (``graph=True``) computes the same
function, but SDPA's reductions over the padded length round differently (measured: 182 of 200 random
decode steps differ in the last bits), so it is equal to rounding, not bit for bit; it is the form a
CUDA graph needs and is tested on CPU against the exact one (same tokens on the test configurations,
logits to 1e-5).
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from contextlib import nullcontext

import torch

from prorl_bench.errors import NonFiniteError
from prorl_bench.models.model import positions
from prorl_bench.models.sampling import _NEG, Rollout, filter_logits

MAX_DECODERS = 4  # decoders (cache + graph) kept per policy: training, validation sampling, greedy, routing


def supports_static(policy: torch.nn.Module) -> bool:
    """Whether ``policy`` has a static decode step (native and fast LLaMA policies; not HF's module)."""
    return callable(getattr(policy, "decode_step", None)) and callable(getattr(policy, "new_cache", None))


def sample_exact(probs: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.multinomial(probs, 1, generator=generator).squeeze(-1)`` without its host syncs.

    torch draws one sample per row as ``argmax(probs / q)`` with ``q ~ Exp(1)`` from
    ``exponential_(1, generator)`` (ATen ``multinomial``, the n_sample = 1 fast path), after checking
    on the host that the probabilities are finite, >= 0 and not all zero in a row. The same draw is
    done here; the check is returned as a device flag (0-dim bool, True = invalid) instead.
    probs: (B, V) float -> ((B,) long, () bool).
    """
    valid = (probs.max() < float("inf")) & (probs.min() >= 0)
    bad = ~valid | (probs.sum(-1) == 0).any()
    q = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / q).argmax(-1), bad


class StaticDecoder:
    """The fixed buffers of one (batch, capacity, max_new_tokens, sampling settings) decode.

    Mutable state lives in tensors only (position, cache index, token index, done flags), so one
    ``step`` is a fixed sequence of kernels with no host value: capturable as a CUDA graph.
    """

    def __init__(self, policy, batch: int, capacity: int, max_new: int, device: torch.device, pad: int, eos: int,
                 banned: tuple[int, ...], temperature: float, top_k: int, top_p: float, greedy: bool,
                 full: bool) -> None:  # fmt: skip
        # weakly: _DECODERS maps policy -> decoders, and a strong reference back would keep every
        # policy (and its KV caches) of a multirun process alive after its job ended
        self._policy = weakref.ref(policy)
        self.max_new, self.pad, self.eos = max_new, pad, eos
        self.temperature, self.top_k, self.top_p, self.greedy = temperature, top_k, top_p, greedy
        self.full = full  # attend over the whole buffer (static shapes) rather than the filled prefix
        self.cache = policy.new_cache(batch, capacity, device)
        long = dict(dtype=torch.long, device=device)
        self.out = torch.full((batch, max_new), pad, **long)
        self.live = torch.zeros(batch, max_new, dtype=torch.bool, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)
        self.bad = torch.zeros((), dtype=torch.bool, device=device)
        self.tok = torch.full((batch, 1), pad, **long)
        self.pos = torch.zeros(batch, 1, **long)
        self.write = torch.zeros(1, **long)  # cache index of the token being forwarded
        self.t = torch.zeros(1, **long)  # completion index of the token being sampled
        self.banned = torch.tensor(sorted(banned), **long)
        self.generator: torch.Generator | None = None
        self.host_write = 0  # the same index on the host: the exact (prefix) form reads it, the graph never
        self.cuda_graph = None
        self.capture_failed = False

    @property
    def policy(self):
        return self._policy()

    # -- the two halves of a token
    def _sample(self, logits: torch.Tensor) -> None:
        """Draw token t from (B, V) logits and record it; advances nothing."""
        z = logits.float() / self.temperature
        z = z.index_fill(-1, self.banned, _NEG) if len(self.banned) else z
        if self.greedy:
            nxt = z.argmax(-1)
        else:
            nxt, bad = sample_exact(torch.softmax(filter_logits(z, self.top_k, self.top_p), -1), self.generator)
            self.bad |= bad
        nxt = torch.where(self.done, torch.full_like(nxt, self.pad), nxt)
        self.out.index_copy_(1, self.t, nxt[:, None])
        self.live.index_copy_(1, self.t, (~self.done)[:, None])
        self.done |= nxt == self.eos
        self.tok.copy_(nxt[:, None])

    def step(self) -> None:
        """Forward token t at cache index ``write``, then sample token t + 1."""
        upto = None if self.full else self.host_write + 1
        logits = self.policy.decode_step(self.tok, self.pos, self.cache, self.write, upto)
        self.pos += 1
        self.write += 1
        self.t += 1
        self._sample(logits)

    # -- one generation
    def start(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generator: torch.Generator | None) -> None:
        """Prefill the prompt (eager: once per rollout) and sample token 0."""
        c = self.cache
        # The eager step keeps the caller's grad mode, so writing a step's k, v into these persistent
        # buffers records autograd history on them; zero_() would chain the next generation's graph onto
        # it and every rollout's activations would stay reachable for the whole run (~4.5 MB/step at the
        # default size). detach() drops the history and keeps the storage (a captured graph's pointers).
        c.keys[:] = [buf.detach().zero_() for buf in c.keys]  # stale keys of a longer earlier prompt
        c.values[:] = [buf.detach().zero_() for buf in c.values]  # must not linger
        c.key_mask.zero_()
        c.length = 0
        p = prompt_ids.shape[1]
        logits = self.policy.forward_cached(prompt_ids, prompt_mask, positions(prompt_mask), c)[:, -1]
        self.generator = generator
        self.out.fill_(self.pad)
        self.live.zero_()
        self.done.zero_()
        self.bad.zero_()
        self.pos.copy_(prompt_mask.long().sum(-1, keepdim=True))
        self.write.fill_(p)
        self.t.zero_()
        self.host_write = p
        self._sample(logits)

    def advance(self) -> None:
        """One more token: a graph replay when captured, else the eager step."""
        if self.cuda_graph is not None:
            self.cuda_graph.replay()
        else:
            self.step()
        self.host_write += 1

    def capture(self, generator: torch.Generator | None) -> bool:
        """Capture ``step`` as a CUDA graph on the current buffers; False (with a warning) if torch cannot.

        Runs before ``start``: the warm-up steps write garbage that ``start`` overwrites, and they draw
        from a scratch generator, so the run's generator is untouched. Each warm-up step and the captured
        one start from cache index 0 and token index 0 (they write index 1: max_new_tokens >= 2). A
        non-default generator must be registered with the graph (``CUDAGraph.register_generator_state``,
        torch >= 2.5; without it: a warning and eager decoding).
        """
        dev = self.cache.key_mask.device
        scratch = torch.Generator(device=dev).manual_seed(0) if generator is not None else None
        g = torch.cuda.CUDAGraph()
        register = getattr(g, "register_generator_state", None)
        if generator is not None and register is None:
            warnings.warn("this torch cannot capture a custom generator in a CUDA graph: eager decode", stacklevel=3)
            return False
        # autocast's weight-cast cache must be off inside a capture (torch's CUDA-graph notes)
        ac = (
            torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)
            if torch.is_autocast_enabled("cuda")
            else nullcontext()
        )
        try:
            with ac:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    self.generator = scratch
                    for _ in range(3):
                        self.write.zero_()  # indices stay inside the buffers for any max_new_tokens >= 1
                        self.t.zero_()
                        self.step()
                torch.cuda.current_stream().wait_stream(side)
                self.write.zero_()
                self.t.zero_()
                self.generator = generator
                if register is not None and generator is not None:
                    register(generator)
                with torch.cuda.graph(g):
                    self.step()
        except Exception as e:  # noqa: BLE001 - a capture torch refuses: decode eagerly, say so
            warnings.warn(f"CUDA graph capture of the decode step failed ({e!r}): decoding eagerly", stacklevel=3)
            return False
        self.cuda_graph = g
        return True


_DECODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # policy -> OrderedDict(key -> decoder)


def _decoder(policy, key: tuple, make) -> StaticDecoder:
    """The policy's decoder for ``key`` (a few kept, least recently used dropped)."""
    per = _DECODERS.setdefault(policy, OrderedDict())
    if key in per:
        per.move_to_end(key)
        return per[key]
    per[key] = make()
    while len(per) > MAX_DECODERS:
        per.popitem(last=False)
    return per[key]


def _python_state(policy: torch.nn.Module) -> tuple:
    """Module state a captured graph would bake in: dual-LoRA scales (routing evaluation), LoRA weight
    overrides (adapter references), routing masks, train/eval mode. A change gets its own graph."""
    state = [policy.training]
    for m in policy.modules():
        for name in ("scales", "override", "row_mask"):
            if hasattr(m, name):
                v = getattr(m, name)
                state.append(v if name == "scales" else tuple(id(t) for t in v) if isinstance(v, tuple) else id(v))
    return tuple(state)


def _decode_loop(dec: StaticDecoder, max_new_tokens: int, check_every: int) -> int:
    """Advance until every row ended (read every ``check_every`` tokens) or the budget is spent;
    returns the index of the last sampled token."""
    t = 0
    while True:
        last = t == max_new_tokens - 1
        if last or (t + 1) % check_every == 0:
            if bool(dec.bad):
                raise NonFiniteError(
                    f"non-finite policy logits while sampling up to token {t} (the weights hold NaN/inf, or the "
                    "temperature over/underflows): the run cannot continue"
                )
            if last or bool(dec.done.all()):
                return t
        dec.advance()
        t += 1


def capacity_for(needed: int, full: bool) -> int:
    """Cache length: exactly ``needed`` for the prefix form; rounded up to a multiple of 32 for the
    whole-buffer form, so rollouts whose prompts differ by a few tokens share one decoder (one graph)."""
    return -(-needed // 32) * 32 if full else needed


def generate_static(policy, tok, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int,
                    temperature: float, top_k: int, generator: torch.Generator | None, greedy: bool, top_p: float,
                    full: bool, check_every: int):  # fmt: skip
    """``rollout.generate`` on fixed buffers; returns the same ``Rollout``. See the module docstring.

    ``full``: attend over the whole buffer (static shapes; on CUDA the step is then captured as a CUDA
    graph) instead of the filled prefix (the exact form). ``check_every``: tokens between host reads
    of the stop / non-finite flags.
    """
    b, p = prompt_ids.shape
    device = prompt_ids.device
    graph = full and device.type == "cuda"
    params = tuple(t.data_ptr() for t in policy.parameters())  # LoRA growth replaces tensors: a new graph
    params += _python_state(policy) if graph else ()
    # a graph is bound to the generator it captured (registered); an eager decoder takes it per call
    ac = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")) if graph else None
    key = (b, capacity_for(p + max_new_tokens, full), max_new_tokens, temperature, top_k, top_p, greedy,
           id(generator) if graph else None, tok.PAD, tok.EOS, tuple(tok.banned_ids), full, params, ac)  # fmt: skip
    dec = _decoder(policy, key, lambda: StaticDecoder(
        policy, b, key[1], max_new_tokens, device, tok.PAD, tok.EOS, tuple(tok.banned_ids), temperature, top_k,
        top_p, greedy, full,
    ))  # fmt: skip
    # the graph form records no autograd history (a captured step could not replay it anyway); the
    # exact form keeps the caller's grad mode, as the dynamic path does, so it picks the same kernels
    with torch.no_grad() if graph else nullcontext():
        # one token never advances (and the capture's step writes token index 1): nothing to capture
        if graph and max_new_tokens >= 2 and dec.cuda_graph is None and not dec.capture_failed:
            dec.capture_failed = not dec.capture(generator)
        dec.start(prompt_ids, prompt_mask, generator)
        t = _decode_loop(dec, max_new_tokens, check_every)
    out, live = dec.out[:, : t + 1].clone(), dec.live[:, : t + 1].clone()
    ids = torch.cat([prompt_ids, out], dim=1)
    key_mask = torch.cat([prompt_mask, torch.ones_like(out, dtype=torch.bool)], dim=1)
    return Rollout(ids=ids, key_mask=key_mask, prompt_len=p, completion_mask=live.float())

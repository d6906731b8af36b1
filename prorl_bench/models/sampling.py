"""What a rollout is and how a token is drawn: the batch of prompts with their completions, the sampling
distribution's logits (temperature, banned ids) and nucleus filtering.

Shared by the dynamic sampler (``rollout.generate``) and the static decoder (``decode.py``), which must draw
from the same distribution bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prorl_bench.errors import NonFiniteError

_NEG = -1e9  # finite "minus infinity": exp() is 0 and 0 * _NEG is 0, so entropies stay finite


@dataclass
class Rollout:
    """One batch of prompts with their sampled completions.

    ids/key_mask: (B, P + L) prompt (left-padded) followed by completion (right-padded after EOS).
    completion_mask: (B, L) float, 1 for generated tokens up to and including EOS.
    """

    ids: torch.Tensor
    key_mask: torch.Tensor
    prompt_len: int
    completion_mask: torch.Tensor

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.ids[:, self.prompt_len :]

    def rows(self, idx: torch.Tensor) -> Rollout:
        return Rollout(self.ids[idx], self.key_mask[idx], self.prompt_len, self.completion_mask[idx])

    def __len__(self) -> int:
        return self.ids.shape[0]


def policy_logits(logits: torch.Tensor, temperature: float, banned: tuple[int, ...]) -> torch.Tensor:
    """The sampling distribution's logits: temperature-scaled, banned ids removed. Computed in fp32."""
    logits = logits.float() / temperature
    logits[..., list(banned)] = _NEG
    return logits


@torch.no_grad()
def nucleus(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al. 2020): keep the smallest set of tokens whose probability
    reaches ``top_p`` (always the most likely one), mask the rest. z: (B, V) logits."""
    sorted_z, order = torch.sort(z, dim=-1, descending=True)
    probs = torch.softmax(sorted_z, -1)
    before = probs.cumsum(-1) - probs  # mass of the tokens ranked above each one
    drop_sorted = before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return z.masked_fill(drop, _NEG)


def filter_logits(z: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """top-k then top-p filtering of sampling logits (..., V): what every sampler draws from, in one order."""
    if top_k > 0:
        kth = torch.topk(z, min(top_k, z.shape[-1]), dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, _NEG)
    if top_p < 1.0:
        z = nucleus(z.reshape(-1, z.shape[-1]), top_p).view_as(z)
    return z


def draw(z: torch.Tensor, logits: torch.Tensor, generator: torch.Generator | None, t: int) -> torch.Tensor:
    """One token per row from filtered logits z (B, V) with ``torch.multinomial``; non-finite ``logits`` (the
    policy's, before filtering) become a NonFiniteError naming token ``t`` instead of torch's message."""
    try:
        return torch.multinomial(torch.softmax(z, -1), 1, generator=generator).squeeze(-1)
    except RuntimeError as e:  # torch: "probability tensor contains either inf, nan or element < 0"
        if torch.isfinite(logits).all():
            raise
        raise NonFiniteError(
            f"non-finite policy logits while sampling token {t} (the weights hold NaN/inf, or the "
            "temperature over/underflows): the run cannot continue"
        ) from e

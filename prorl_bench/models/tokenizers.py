"""The character tokenizer of the native policy (HF models bring their own: hf_model.HFTokenizer).

Kept apart from the tasks so that rollout, evaluation and the base warm-up, which only need a
tokenizer, do not import the task registry.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class CharTokenizer:
    """Printable-ASCII character tokenizer shared by all tasks. ids: 0 pad, 1 bos, 2 eos."""

    PAD, BOS, EOS = 0, 1, 2
    _FIRST = 32  # ' '
    _LAST = 126  # '~'

    @property
    def vocab_size(self) -> int:
        return 3 + self._LAST - self._FIRST + 1

    @property
    def banned_ids(self) -> tuple[int, ...]:
        """Ids removed from the sampling distribution (never a valid completion token)."""
        return (self.PAD, self.BOS)

    def encode(self, text: str) -> list[int]:
        out = []
        for ch in text:
            o = ord(ch)
            if not self._FIRST <= o <= self._LAST:
                raise ValueError(f"character {ch!r} is outside the tokenizer's printable ASCII range")
            out.append(3 + o - self._FIRST)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Decode up to the first EOS; pad and BOS are skipped."""
        chars = []
        for i in ids:
            i = int(i)
            if i == self.EOS:
                break
            if i >= 3:
                chars.append(chr(i - 3 + self._FIRST))
        return "".join(chars)

    def encode_prompts(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pad prompts (each prefixed with BOS). Returns ids (B, P) long and mask (B, P) bool."""
        seqs = [[self.BOS] + self.encode(p) for p in prompts]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.PAD, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.bool)
        for row, s in enumerate(seqs):
            ids[row, width - len(s) :] = torch.tensor(s)
            mask[row, width - len(s) :] = True
        return ids, mask

"""One request's place in its grammar: the token mask for the next token, advanced at commit.

The mask is llguidance's bitmask (one bit per token, 32 tokens per int32 word); masked tokens'
logits become -inf. A verify step's rows get the masks after the lane's first i drafts: the
drafts the grammar allows are consumed one by one, each row's mask computed, then rolled
back, so the state changes only at commit (`accept`). Rows after a draft the grammar refuses
are left as they are: that draft is masked in the row before, so verify rejects it there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

BITS = 32


class GrammarMatcher:
    def __init__(self, matcher: Any, stop_ids: Sequence[int]):
        self._m = matcher  # llguidance.LLMatcher
        self._stop_ids = tuple(stop_ids)

    def accept(self, token_id: int) -> None:
        """The engine kept `token_id`. A token the grammar refused (only an end-of-sequence the
        request was allowed past, e.g. by ignore_eos) leaves the matcher stopped."""
        self._m.consume_token(token_id)

    @property
    def is_accepting(self) -> bool:
        return self._m.is_accepting()

    def fill_masks(self, logits: torch.Tensor, drafts: Sequence[int] = ()) -> None:
        """`logits` [1 + len(drafts), vocab] float32: row i masked to what the grammar allows
        after the first i drafts."""
        rows, vocab = logits.shape
        words = (vocab + BITS - 1) // BITS
        masks = torch.zeros((rows, words), dtype=torch.int32)  # [rows, words], CPU
        num_valid = self._m.validate_tokens(list(drafts)) if drafts else 0
        filled = 0
        try:
            for i in range(num_valid + 1):
                self._fill(masks[i])
                filled = i + 1
                if i < num_valid and not self._m.consume_token(drafts[i]):
                    break
        finally:
            if filled > 1:
                self._m.rollback(filled - 1)
        masks[filled:] = -1  # unreachable rows: left unmasked
        apply_masks(logits, masks)

    def _fill(self, row: torch.Tensor) -> None:
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())
        if not bool(row.any()):  # a stopped or failed matcher: only ending is left
            words = row.numpy().view(np.uint32)
            for t in self._stop_ids:
                words[t // BITS] |= np.uint32(1 << (t % BITS))


def apply_masks(logits: torch.Tensor, masks: torch.Tensor) -> None:
    """-inf where `masks` [rows, words] int32 (CPU) has a 0 bit; `logits` [rows, vocab] float32."""
    rows, vocab = logits.shape
    bits = np.unpackbits(masks.numpy().view(np.uint8), axis=-1, bitorder="little")[:, :vocab]  # [rows, vocab]
    refused = bits == 0
    if logits.device.type == "cpu" and logits.is_contiguous():
        np.copyto(logits.numpy(), -np.inf, where=refused)  # far faster than masked_fill_ on CPU
    else:
        logits.masked_fill_(torch.from_numpy(refused).to(logits.device), -torch.inf)

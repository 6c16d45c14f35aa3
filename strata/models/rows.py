"""Which rows of a step are decode rows and which are prompt rows, and how prompt rows are read.

A step's token rows are in row order: decoding lanes' rows first (their pending tokens and
drafts), then prompt pieces (runner/inputs.py). Projections and the head choose their path
by a row's kind (models/linear.py, models/head.py): decode rows may read a 4-bit or int8
form, prompt rows read the dense weights, so a prompt's tokens take one path whether or not
a prefix of it was cached and whatever lanes decode beside it.

A prompt row that samples (a prompt's last token) is multiplied by the dense weights on its
own: a dense GEMM's rows are not bit-identical across row counts (the library picks its
kernel by the count), and a retry whose prefix is cached computes that row alone, so a cold
prompt does too; the same chat sent twice at temperature 0 then answers the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class RowKinds:
    decode: int  # token rows [0, decode) are decode rows, the rest prompt rows
    decode_logits: int  # logits rows [0, decode_logits) are decode rows' (logits rows keep row order)
    alone: tuple[int, ...] = ()  # prompt token rows that sample, ascending: each multiplied on its own
    alone_logits: bool = False  # every prompt logits row is a sampling row: each multiplied on its own

    @staticmethod
    def all_decode(num_rows: int, num_logits: int) -> RowKinds:
        return RowKinds(num_rows, num_logits)


def dense_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, first: int,
               alone: Sequence[int] = ()) -> torch.Tensor:
    """x[first:] @ weight^T (+ bias) -> [rows - first, out], each row of `alone` (>= first) by
    itself, the runs between them together."""
    if not alone:
        return F.linear(x[first:] if first else x, weight, bias)
    parts: list[torch.Tensor] = []
    start = first
    for a in alone:
        if a > start:
            parts.append(F.linear(x[start:a], weight, bias))
        parts.append(F.linear(x[a:a + 1], weight, bias))
        start = a + 1
    if start < x.shape[0]:
        parts.append(F.linear(x[start:], weight, bias))
    return parts[0] if len(parts) == 1 else torch.cat(parts)

"""Attention that reads and writes K/V only through chunk tables.

The runner turns each step's chunk tables into addressing once (per device): every layer
then writes its new K/V with one `index_copy_` and reads each lane's cells in the way its
addressing names (`models/cell_reads.py`: in place, strided, run by run, or gathered).
Decoding lanes (one new token each) attend in groups; each prefill piece attends alone,
causally aligned to its last cell.

Rows of the step's token batch: the decoding lanes first (one row each, in group order),
then each prefill piece's rows in order.

A prompt's sampling row (its last) attends as one query over all its cells: with the fused
decode kernel a piece's rows are read so, each over its own cells (a `DecodeSpans` read of
the piece's rows); otherwise the row is read again on its own (`AttentionMeta.samples`,
runner/inputs.py). Its output is then the same whether it was the last row of a long piece
(a cold prompt) or a piece of one row (a retry whose prefix is cached), and whatever its
lane's cells' layout (models/rows.py).

A layer's caches are `Cells` (cells/protocol.py): attention writes and reads them only
through that protocol, whatever stores them (dense, int8 quantised on the write and
dequantised where read, or the ring's view of one step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from strata.models.cell_reads import DecodeRead, PrefillRead

if TYPE_CHECKING:
    from strata.cells.protocol import Cells as Cache


@dataclass(frozen=True)
class AttentionMeta:
    """One step's addressing on one device; shared by every layer on it."""

    write_index: torch.Tensor  # [tokens] the flat cell each new token's K/V goes to
    decode: tuple[DecodeRead, ...]  # groups of the decoding lanes, rows in order; then prompt pieces read row by row
    prefills: tuple[PrefillRead, ...]
    # one row each: a prompt's sampling row, read after (and over) its piece's output, if any
    samples: tuple[DecodeRead, ...] = ()

    def to(self, device: torch.device) -> AttentionMeta:
        """The same addressing with its tensors on `device`."""
        return AttentionMeta(self.write_index.to(device, non_blocking=True),
                             tuple(d.to(device) for d in self.decode), tuple(p.to(device) for p in self.prefills),
                             tuple(s.to(device) for s in self.samples))


def attend(
    q: torch.Tensor,  # [tokens, heads, head_dim], already rotated
    k: torch.Tensor,  # [tokens, kv_heads, head_dim], already rotated
    v: torch.Tensor,  # [tokens, kv_heads, head_dim]
    k_cache: Cache,  # [kv_heads, cells, head_dim]
    v_cache: Cache,  # [kv_heads, cells, head_dim]
    meta: AttentionMeta,
) -> torch.Tensor:
    """Writes the new K/V into the cache, then attends; returns [tokens, heads * head_dim]."""
    k_cache.write(meta.write_index, k.transpose(0, 1))
    v_cache.write(meta.write_index, v.transpose(0, 1))
    return attend_written(q, k_cache, v_cache, meta)


def attend_written(q: torch.Tensor, k_cache: Cache, v_cache: Cache, meta: AttentionMeta) -> torch.Tensor:
    """`attend` once the step's K/V is in the cache (the fused rope_write put it there)."""
    num_tokens, num_heads, head_dim = q.shape
    if len(meta.decode) == 1 and not meta.prefills and not meta.samples:  # the common decode step: no output copy
        return meta.decode[0].attend(q, k_cache, v_cache).reshape(num_tokens, num_heads * head_dim)
    out = q.new_empty(num_tokens, num_heads, head_dim)
    for d in meta.decode:
        rows = slice(d.row_start, d.row_start + d.num_rows)
        out[rows] = d.attend(q[rows], k_cache, v_cache)
    for p in meta.prefills:
        out[p.row_start : p.row_end] = p.attend(q[p.row_start : p.row_end], k_cache, v_cache)
    for s in meta.samples:
        out[s.row_start : s.row_start + 1] = s.attend(q[s.row_start : s.row_start + 1], k_cache, v_cache)
    return out.view(num_tokens, num_heads * head_dim)


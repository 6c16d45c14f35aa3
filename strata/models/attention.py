"""Attention that reads and writes K/V only through chunk tables.

The runner turns each step's chunk tables into addressing once (per device): every layer
then writes its new K/V with one `index_copy_` and reads each lane's cells back in place
where it can (one contiguous lane; several lanes evenly spaced, through one strided view;
a long lane in a few runs of chunks, run by run, merged by log-sum-exp) and through a
gather of flat cell indices otherwise. Decoding lanes (one new token each) attend in
length groups; each prefill piece attends alone, causally aligned to its last cell.

Rows of the step's token batch: the decoding lanes first (one row each, in length
groups), then each prefill piece's rows in order.

A cache is a tensor [kv_heads, cells, head_dim] in the K/V dtype, or `Int8Cells` (`--kv
int8`): `_write` quantises on the write, and each read path (`_read`, `_read_strided`)
dequantises exactly the cells it reads into the compute dtype right before attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from strata.kv.quant import Int8Cells, strided

Cache = torch.Tensor | Int8Cells


@dataclass(frozen=True)
class DecodeRows:
    """One new token for each of `num_rows` lanes (rows from `row_start`), padded to `max_cells`."""

    row_start: int
    num_rows: int
    max_cells: int
    cell_index: torch.Tensor | None  # [rows * max_cells] flat cells to read (padding reads cell 0)
    mask: torch.Tensor | None  # [rows or slots, 1, 1, max_cells] bool, True on the row's own cells; None: no padding
    cell_slice: slice | None = None  # one row whose cells are contiguous: read them in place
    # (first cell, distance, slots): slot s's cells start at first + s * distance; all slots
    # are read as one strided view
    cell_strided: tuple[int, int, int] | None = None
    slots: torch.Tensor | None = None  # [rows] each row's slot; None: row r is slot r
    cell_runs: tuple[slice, ...] | None = None  # one row whose cells are these runs, in order


@dataclass(frozen=True)
class PrefillRows:
    """`row_end - row_start` new tokens of one lane, reading `num_cells` cells: the new
    tokens are the last of those cells, each attending to the cells up to its own."""

    row_start: int
    row_end: int
    num_cells: int
    cell_slice: slice | None  # the lane's cells are flat[slice] when contiguous
    cell_index: torch.Tensor | None  # else: [num_cells] flat cells
    cell_runs: tuple[slice, ...] | None = None  # or: these runs, in order, read in place
    run_masks: tuple[torch.Tensor | None, ...] | None = None  # per run: [rows, <= rows cells] bool, None: all seen


@dataclass(frozen=True)
class AttentionMeta:
    """One step's addressing on one device; shared by every layer on it."""

    write_index: torch.Tensor  # [tokens] the flat cell each new token's K/V goes to
    decode: tuple[DecodeRows, ...]  # length groups of the decoding lanes, rows in order
    prefills: tuple[PrefillRows, ...]


def attend(
    q: torch.Tensor,  # [tokens, heads, head_dim], already rotated
    k: torch.Tensor,  # [tokens, kv_heads, head_dim], already rotated
    v: torch.Tensor,  # [tokens, kv_heads, head_dim]
    k_cache: Cache,  # [kv_heads, cells, head_dim]
    v_cache: Cache,  # [kv_heads, cells, head_dim]
    meta: AttentionMeta,
) -> torch.Tensor:
    """Writes the new K/V into the cache, then attends; returns [tokens, heads * head_dim]."""
    _write(k_cache, meta.write_index, k.transpose(0, 1))
    _write(v_cache, meta.write_index, v.transpose(0, 1))
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    out = q.new_empty(num_tokens, num_heads, head_dim)
    for d in meta.decode:
        rows = slice(d.row_start, d.row_start + d.num_rows)
        out[rows] = _decode(q[rows], k_cache, v_cache, d)
    for p in meta.prefills:
        if p.cell_runs is not None:
            qp = q[p.row_start : p.row_end]
            out[p.row_start : p.row_end] = _attend_runs(qp, k_cache, v_cache, p.cell_runs, p.run_masks)
            continue
        cells = p.cell_slice if p.cell_slice is not None else p.cell_index  # gathers: 4x index_select's speed
        kc, vc = _read(k_cache, cells, q.dtype), _read(v_cache, cells, q.dtype)
        qp = q[p.row_start : p.row_end].transpose(0, 1).unsqueeze(0)  # [1, heads, rows, dim]
        rows = p.row_end - p.row_start
        # Causal, aligned to the last cell: rows after cached cells see all of those (SDPA
        # builds the [rows, cells] mask itself where its kernel cannot apply it in place).
        mask = causal_lower_right(rows, p.num_cells) if 1 < rows < p.num_cells else None
        o = F.scaled_dot_product_attention(
            qp,
            kc.unsqueeze(0),
            vc.unsqueeze(0),
            attn_mask=mask,
            is_causal=rows == p.num_cells and rows > 1,
            enable_gqa=num_heads != num_kv_heads,
        )
        out[p.row_start : p.row_end] = o[0].transpose(0, 1)
    return out.view(num_tokens, num_heads * head_dim)


def _write(cache: Cache, index: torch.Tensor, x: torch.Tensor) -> None:
    """x [kv_heads, len(index), head_dim] into flat cells `index` (quantised for int8)."""
    if isinstance(cache, Int8Cells):
        cache.write(index, x)
    else:
        cache.index_copy_(1, index, x.to(cache.dtype))


def _read(cache: Cache, cells: slice | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[kv_heads, cells, head_dim] in `dtype`: a view of a slice where the dtypes agree, else a copy."""
    if isinstance(cache, Int8Cells):
        return cache.read(cells, dtype)
    return cache[:, cells].to(dtype)


def _decode(q: torch.Tensor, k_cache: Cache, v_cache: Cache, d: DecodeRows) -> torch.Tensor:
    """q [rows, heads, dim] -> [rows, heads, dim], each row over its own lane's cells.

    The query heads sharing one K/V head are that head's query rows for SDPA, so K/V is
    read once per K/V head and never expanded (its fused CPU kernel is about 2x the
    separate matmuls and softmax at these sizes).
    """
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    if d.cell_runs is not None:
        return _attend_runs(q, k_cache, v_cache, d.cell_runs, (None,) * len(d.cell_runs))
    if d.cell_slice is not None:
        k = _read(k_cache, d.cell_slice, q.dtype).unsqueeze(0)  # [1, kvh, cells, dim], a view
        v = _read(v_cache, d.cell_slice, q.dtype).unsqueeze(0)
    elif d.cell_strided is not None:
        k, v = _read_strided(k_cache, d, q.dtype), _read_strided(v_cache, d, q.dtype)  # [slots, kvh, cells, dim]
        if d.slots is not None:  # slots no row uses get zero queries; their output is dropped
            qg = q.new_zeros(d.cell_strided[2], num_kv_heads, num_heads // num_kv_heads, head_dim)
            qg[d.slots] = q.view(rows, num_kv_heads, -1, head_dim)
            o = F.scaled_dot_product_attention(qg, k, v, attn_mask=d.mask)
            return o[d.slots].reshape(rows, num_heads, head_dim)
    else:
        # Advanced indexing gathers along cells about 4x faster than index_select(1, ...).
        k = _read(k_cache, d.cell_index, q.dtype).view(num_kv_heads, rows, d.max_cells, head_dim).transpose(0, 1)
        v = _read(v_cache, d.cell_index, q.dtype).view(num_kv_heads, rows, d.max_cells, head_dim).transpose(0, 1)
    qg = q.view(rows, num_kv_heads, num_heads // num_kv_heads, head_dim)  # [rows, kvh, group, dim]
    o = F.scaled_dot_product_attention(qg, k, v, attn_mask=d.mask)
    return o.reshape(rows, num_heads, head_dim)


def _read_strided(cache: Cache, d: DecodeRows, dtype: torch.dtype) -> torch.Tensor:
    """[slots, kv_heads, max_cells, dim] of `cache` [kv_heads, cells, dim] (a view where the
    dtypes agree); padding reads other lanes' cells (written or zero, never garbage), which
    the mask hides."""
    first, distance, num_slots = d.cell_strided
    if isinstance(cache, Int8Cells):
        return cache.read_strided(first, distance, num_slots, d.max_cells, dtype)
    return strided(cache, first, distance, num_slots, d.max_cells).to(dtype)


def _attend_runs(
    q: torch.Tensor,  # [rows, heads, dim]: one lane's new tokens
    k_cache: Cache,
    v_cache: Cache,
    runs: tuple[slice, ...],
    masks: tuple[torch.Tensor | None, ...],  # per run: [rows, run cells] bool, None: all seen
) -> torch.Tensor:
    """One lane's rows over cells in a few contiguous runs, without copying them: attention
    over each run in place, merged by each run's log-sum-exp (CPU: the kernel SDPA itself
    uses, which also returns the log-sum-exp). Returns [rows, heads, dim]."""
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    group = num_heads // num_kv_heads
    # A K/V head's query heads, each over every row, are its query rows: [1, kvh, group * rows, dim].
    qg = q.view(rows, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(1, num_kv_heads, -1, head_dim)
    outs, lses = [], []
    for run, mask in zip(runs, masks):
        k = _read(k_cache, run, q.dtype).unsqueeze(0)  # [1, kvh, run cells, dim], a view
        v = _read(v_cache, run, q.dtype).unsqueeze(0)
        bias = None
        if mask is not None:
            mask = mask.repeat(group, 1)  # [group * rows, run cells]
            bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qg, k, v, attn_mask=bias)[:2]
        if mask is not None:  # a row that sees none of the run: the kernel says lse 0, it is -inf
            lse = lse.masked_fill(~mask.any(-1), float("-inf"))
        outs.append(o.float())  # [1, kvh, group * rows, dim]
        lses.append(lse)  # [1, kvh, group * rows]
    weights = torch.softmax(torch.stack(lses), dim=0).unsqueeze(-1)  # [runs, 1, kvh, group * rows, 1]
    o = (weights * torch.stack(outs)).sum(0).to(q.dtype)  # [1, kvh, group * rows, dim]
    return o.view(num_kv_heads, group, rows, head_dim).permute(2, 0, 1, 3).reshape(rows, num_heads, head_dim)

"""One layer's K (or V) as attention sees it through the ring, for one step.

Cells are addressed in one virtual space: [0, A) are the arena's cells (resident pages,
slot s at s * page), [A, A + S) the staging buffer's (this step's streamed pages).
Reads are slices that never cross A (runner's ring reads cut runs there). A write goes
to the new cells' device copies (arena or staging, by index) and through to the host
pool, which stays complete: the host index names the same rows' pool cells.
"""

from __future__ import annotations

import torch

from strata.cells.int8 import Int8Cells

Tensor = torch.Tensor


def _read(t: Tensor | Int8Cells, cells: slice, dtype: torch.dtype) -> Tensor:
    if isinstance(t, Int8Cells):
        return t.read(cells, dtype)
    return t[:, cells].to(dtype)


def _write(t: Tensor | Int8Cells, index: Tensor, x: Tensor) -> None:
    if isinstance(t, Int8Cells):
        t.write(index, x)
    else:
        t.index_copy_(1, index, x.to(t.dtype))


class RingCells:
    def __init__(
        self,
        arena: Tensor | Int8Cells,  # [kv_heads, A, head_dim] this layer's arena
        staging: Tensor | Int8Cells,  # [kv_heads, >= S, head_dim] the device's staging buffer
        host: Tensor | Int8Cells,  # [kv_heads, pool cells, head_dim] this layer's pool storage
        host_index: Tensor,  # [tokens] the pool cell of each new token (on the host)
        writes: tuple[Tensor, Tensor, Tensor, Tensor],  # rows and cells in the arena, rows and cells in staging
        writeback: list | None,  # None: write the host now; else (host, index, x on host) for finish()
    ):
        self.arena = arena
        self.staging = staging
        self.host = host
        self.host_index = host_index
        self.writes = writes
        self.writeback = writeback
        self.num_arena_cells = arena.shape[1]

    @property
    def shape(self) -> tuple[int, int, int]:
        heads, _, dim = self.arena.shape
        return heads, self.num_arena_cells + self.staging.shape[1], dim

    def read(self, cells: slice, dtype: torch.dtype) -> Tensor:
        """[kv_heads, cells, head_dim] in `dtype`: a view of the arena or staging where dtypes agree."""
        if not isinstance(cells, slice):
            raise TypeError("reads through the ring are slices of one buffer")
        a = self.num_arena_cells
        if cells.stop <= a:
            return _read(self.arena, cells, dtype)
        assert cells.start >= a, "a ring read crosses from the arena into staging"
        return _read(self.staging, slice(cells.start - a, cells.stop - a), dtype)

    def write(self, index: Tensor, x: Tensor) -> None:
        """x [kv_heads, len(index), head_dim] into virtual cells `index` (split by the step
        beforehand into `writes`, so no device sync here) and into its pool cells."""
        arena_rows, arena_cells, staged_rows, staged_cells = self.writes
        if arena_rows.numel() == x.shape[1]:
            _write(self.arena, arena_cells, x)
        else:
            if arena_rows.numel():
                _write(self.arena, arena_cells, x.index_select(1, arena_rows))
            _write(self.staging, staged_cells, x.index_select(1, staged_rows))
        if self.writeback is None:
            _write(self.host, self.host_index, x)
        else:  # an accelerator: the host copy is written once the step's forward is done
            self.writeback.append((self.host, self.host_index, x.to("cpu", non_blocking=True)))

    def fused_write(self, ops, qkv: Tensor, cos: Tensor, sin: Tensor, v: RingCells, num_heads: int,
                    num_kv_heads: int) -> Tensor | None:
        """With the fused CPU ops (models/fused.py): rotate q and k of `qkv` [tokens, (heads + 2 *
        kv_heads) * dim] and write k (into self) and v (into `v`) in one pass per copy, when every
        new cell is in the arena and all are plain tensors of qkv's dtype; returns q, else None."""
        arena_rows, arena_cells, _, _ = self.writes
        plain = (self.arena, v.arena, self.host, v.host)
        if (self.writeback is not None or arena_rows.numel() != qkv.shape[0]
                or not all(isinstance(t, Tensor) and t.dtype == qkv.dtype for t in plain)):
            return None
        q = ops.rope_write(qkv, cos, sin, self.arena, v.arena, arena_cells, num_heads, num_kv_heads)
        ops.rope_write(qkv, cos, sin, self.host, v.host, self.host_index, num_heads, num_kv_heads)  # the pool's copy
        return q

"""The one way the model reads and writes K/V: one layer's K (or V) cells.

Attention (models/attention.py, models/cell_reads.py) knows only this protocol; its
implementations are `DenseCells` (cells/dense.py: the K/V dtype as stored), `Int8Cells`
(cells/int8.py: int8 values plus a float16 scale per cell and head, dequantised where
read) and `RingCells` (cells/ring_cells.py: one step's view through the resident ring).

Shapes: a layer's cells are [kv_heads, cells, head_dim] with cells on dim 1 in every part
(so a cell copy, a session record or a page stream copies `parts` along dim 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass(slots=True)  # not frozen: one is made per layer and step, and a frozen __init__ is slower
class WriteTargets:
    """Where the fused rope-write (the extension's `rope_write`) stores a step's new K and V in
    place: one entry per copy (the pool's storage, or the ring's pool copy and its arena and/or
    staging), storages [kv_heads, cells, head_dim] written at `cells` (one cell per new row, -1
    for a row not stored in that copy). int8 cells add their float16 scales [kv_heads, cells]
    (the new rows quantised there, `Int8Cells.write`'s values); cells in a compute dtype, none."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    cells: list[torch.Tensor]
    k_scales: list[torch.Tensor] = field(default_factory=list)
    v_scales: list[torch.Tensor] = field(default_factory=list)

    @staticmethod
    def joined(parts: list[WriteTargets]) -> WriteTargets:
        """Several copies' targets as one (each copy stored the same way)."""
        assert len({bool(p.k_scales) for p in parts}) == 1, "every copy int8, or none"
        joined = WriteTargets([], [], [])
        for p in parts:
            joined.k += p.k
            joined.v += p.v
            joined.cells += p.cells
            joined.k_scales += p.k_scales
            joined.v_scales += p.v_scales
        return joined


class Cells(Protocol):
    @property
    def shape(self) -> tuple[int, int, int]:
        """(kv_heads, cells, head_dim)."""

    @property
    def parts(self) -> tuple[torch.Tensor, ...]:
        """The tensors holding the cells, cells on dim 1 (what a copy of cells copies)."""

    def read(self, cells: slice | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[kv_heads, n, head_dim] in `dtype`: a slice of cells (a view where the dtypes agree) or
        a gather of flat cell indices."""

    def read_strided(self, first: int, distance: int, num_slots: int, num_cells: int,
                     dtype: torch.dtype) -> torch.Tensor:
        """[slots, kv_heads, num_cells, head_dim]: slot s's cells start at `first + s * distance`."""

    def write(self, index: torch.Tensor, x: torch.Tensor) -> None:
        """x [kv_heads, len(index), head_dim] into the cells `index`."""

    def kernel_view(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The storage itself, [kv_heads, cells, head_dim], when the fused CPU kernels can read and
        write it in place (stored as `dtype`); None otherwise."""

    def kernel_reads(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...] | None:
        """What the fused decode attention reads in place (stored as `dtype`): one storage
        [kv_heads, cells, head_dim], or two whose flat cells continue each other (the second's
        cell 0 is the first's cell count: the ring's staging after its arena); None otherwise."""

    def kernel_scaled_reads(self) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]] | None:
        """What the fused decode attention reads in place from int8 cells: (storages int8
        [kv_heads, cells, head_dim], their float16 scales [kv_heads, cells]), one storage or two
        as in `kernel_reads`, read as int8 x scale rounded to the compute dtype (`Int8Cells.read`'s
        values). None for cells not stored so."""

    def write_targets(self, v: Cells, index: torch.Tensor, dtype: torch.dtype) -> WriteTargets | None:
        """Where the fused rope-write stores the step's new K (here) and V (`v`) at `index` for
        activations in `dtype`: storages in `dtype`, or int8 ones with their scales. None where
        these cells cannot be written so (the caller then rotates and writes through `write`)."""

    def zeros_like(self, num_cells: int, device: torch.device) -> Cells:
        """Zeroed cells of this kind and geometry, `num_cells` of them, on `device`."""

    def pinned(self) -> Cells:
        """The same cells in pinned host memory (for non-blocking copies to an accelerator)."""

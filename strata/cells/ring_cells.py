"""One layer's K (or V) as attention sees it through the ring: kept per layer while the ring's
buffers stay, pointed at each step's new cells.

Cells are addressed in one virtual space: [0, A) are the arena's cells (resident pages,
slot s at s * page), [A, A + S) the staging buffer's (this step's streamed pages).
Reads are slices that never cross A (runner's ring reads cut runs there). A write goes
to the new cells' device copies (arena or staging, by index) and through to the host
pool, which stays complete: the host index names the same rows' pool cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from strata.cells.protocol import Cells, WriteTargets

Tensor = torch.Tensor


@dataclass(frozen=True)
class StepWrites:
    """Where a step's new cells lie, rows in order: the rows (and their cells) in the arena and
    in staging (cells from its start), then each row's arena cell and staging cell (-1: written to
    the other: the fused rope-write's skip). All [rows or fewer] long tensors on one device."""

    arena_rows: Tensor
    arena_cells: Tensor
    staged_rows: Tensor
    staged_cells: Tensor
    arena_index: Tensor
    staged_index: Tensor
    in_arena: bool  # some new cell lies in the arena
    in_staging: bool  # some new cell lies in staging

    @classmethod
    def split(cls, cells: Sequence[int], num_arena_cells: int) -> StepWrites:
        """`cells`: each row's virtual cell; on the host (a handful of rows: plain lists). The six
        indices are views of one tensor (one host-to-tensor conversion a step)."""
        a = num_arena_cells
        arena = [(r, c) for r, c in enumerate(cells) if c < a]
        staged = [(r, c - a) for r, c in enumerate(cells) if c >= a]
        values = ([r for r, _ in arena] + [c for _, c in arena] + [r for r, _ in staged] + [c for _, c in staged]
                  + [c if c < a else -1 for c in cells] + [c - a if c >= a else -1 for c in cells])
        n, m = len(arena), len(staged)
        parts = torch.tensor(values, dtype=torch.long).split([n, n, m, m, len(cells), len(cells)])
        return cls(*parts, bool(arena), bool(staged))

    def to(self, device: torch.device) -> StepWrites:
        return StepWrites(*(t.to(device, non_blocking=True) for t in (
            self.arena_rows, self.arena_cells, self.staged_rows, self.staged_cells, self.arena_index,
            self.staged_index)), self.in_arena, self.in_staging)


@dataclass(slots=True)
class StepState:
    """The step a device's layer views serve now: one per ring and device, pointed once a step
    (`point`) rather than every view every layer. `cells`: the write targets' per-row cells, the
    pool's then the arena's and staging's where a new cell lies in them (cells/protocol.py)."""

    host_index: Tensor | None = None  # [tokens] the pool cell of each new token (on the host)
    writes: StepWrites | None = None  # where the step's new cells lie, on this device
    writeback: list | None = None  # None: write the host now; else (host, index, x on host) for finish()
    cells: list[Tensor] = field(default_factory=list)  # read only: every layer's targets share it

    def point(self, host_index: Tensor, writes: StepWrites, writeback: list | None) -> None:
        self.host_index, self.writes, self.writeback = host_index, writes, writeback
        self.cells = [host_index, *([writes.arena_index] if writes.in_arena else []),
                      *([writes.staged_index] if writes.in_staging else [])]


class RingCells:
    """One layer's K (or V) through the ring. The ring keeps one per layer while its arena and
    staging stay (cells/ring.py `layer_views`), so what the fused kernels read and write in place is
    worked out once, not every layer and step; its device's `StepState`, shared by every view there
    and pointed at each step's new cells, says where this step writes."""

    __slots__ = ("arena", "staging", "host", "state", "num_arena_cells", "_storages", "_reads")

    def __init__(
        self,
        arena: Cells,  # [kv_heads, A, head_dim] this layer's arena
        staging: Cells,  # [kv_heads, >= S, head_dim] the device's staging buffer
        host: Cells,  # [kv_heads, pool cells, head_dim] this layer's pool storage
        state: StepState,  # the step its device's views serve now
    ):
        self.arena = arena
        self.staging = staging
        self.host = host
        self.state = state
        self.num_arena_cells = arena.shape[1]
        self._storages: dict[tuple, WriteTargets | None] = {}  # (v, in arena, in staging, dtype) -> targets
        self._reads: dict[object, tuple | None] = {}  # dtype (or None: int8) -> kernel_reads (kernel_scaled_reads)

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
            return self.arena.read(cells, dtype)
        assert cells.start >= a, "a ring read crosses from the arena into staging"
        return self.staging.read(slice(cells.start - a, cells.stop - a), dtype)

    @property
    def parts(self) -> tuple[Tensor, ...]:
        raise TypeError("a ring step's cells are a view for attention: copies go through the pool")

    def read_strided(self, first: int, distance: int, num_slots: int, num_cells: int,
                     dtype: torch.dtype) -> Tensor:
        raise TypeError("reads through the ring are slices of one buffer")

    def kernel_view(self, dtype: torch.dtype) -> Tensor | None:
        """None: the virtual space is two buffers; writes go through `write_targets`, reads through
        `kernel_reads`."""
        return None

    def kernel_reads(self, dtype: torch.dtype) -> tuple[Tensor, ...] | None:
        """The arena's storage, then staging's: their flat cells are the virtual cells (staging's
        cell 0 is virtual cell A), so the fused decode attention reads resident and streamed
        pages in one call, spans never crossing A (runner/ring_reads.py)."""
        if dtype not in self._reads:
            arena, staging = self.arena.kernel_view(dtype), self.staging.kernel_view(dtype)
            self._reads[dtype] = None if arena is None or staging is None else (arena, staging)
        return self._reads[dtype]

    def kernel_scaled_reads(self) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]] | None:
        """int8 arena and staging: their storages and scales, as `kernel_reads`."""
        if None not in self._reads:
            arena, staging = self.arena.kernel_scaled_reads(), self.staging.kernel_scaled_reads()
            self._reads[None] = (None if arena is None or staging is None
                                 else ((arena[0][0], staging[0][0]), (arena[1][0], staging[1][0])))
        return self._reads[None]

    def write(self, index: Tensor, x: Tensor) -> None:
        """x [kv_heads, len(index), head_dim] into virtual cells `index` (split by the step
        beforehand into `writes`, so no device sync here) and into its pool cells."""
        s = self.state
        w = s.writes
        if not w.in_staging:
            self.arena.write(w.arena_cells, x)
        else:
            if w.in_arena:
                self.arena.write(w.arena_cells, x.index_select(1, w.arena_rows))
            self.staging.write(w.staged_cells, x.index_select(1, w.staged_rows))
        if s.writeback is None:
            self.host.write(s.host_index, x)
        else:  # an accelerator: the host copy is written once the step's forward is done
            s.writeback.append((self.host, s.host_index, x.to("cpu", non_blocking=True)))

    def write_targets(self, v: RingCells, index: Tensor, dtype: torch.dtype) -> WriteTargets | None:
        """The pool's copy, and the arena and staging where some new cell lies in them (each
        with its cell per row, -1 for rows written to the other), when the host is written now
        (not by an accelerator's writeback) and every part takes the fused write (`index` is the
        virtual one: the step split it into `writes`); else None."""
        s = self.state
        if s.writeback is not None:
            return None
        w, cells = s.writes, s.cells
        key = (v, w.in_arena, w.in_staging, dtype)
        if key not in self._storages:  # the same storages every step with these buffers written
            pairs = [(self.host, v.host)]
            if w.in_arena:
                pairs.append((self.arena, v.arena))
            if w.in_staging:
                pairs.append((self.staging, v.staging))
            parts = [k_cells.write_targets(v_cells, index, dtype) for (k_cells, v_cells), index in zip(pairs, cells)]
            assert all(p is None or (len(p.cells) == 1 and p.cells[0] is index) for p, index in zip(parts, cells)), \
                "each copy one storage, written at the index it was given"
            joined = None if any(p is None for p in parts) else WriteTargets.joined(parts)
            self._storages[key] = (None if joined is None  # the storages alone: the cells are each step's
                                   else WriteTargets(joined.k, joined.v, [], joined.k_scales, joined.v_scales))
        t = self._storages[key]
        return None if t is None else WriteTargets(t.k, t.v, cells, t.k_scales, t.v_scales)

    def zeros_like(self, num_cells: int, device: torch.device) -> Cells:
        return self.arena.zeros_like(num_cells, device)

    def pinned(self) -> RingCells:
        raise TypeError("a ring step's cells live on the device")

"""Where a lane's cells sit in K/V storage, and how attention reads them: in place when
contiguous, several lanes through one strided view when evenly spaced, a long lane run by
run when its chunks form few runs or long ones; a gather of flat cell indices otherwise."""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from strata.step import LaneWork


def contiguous(chunk_ids: Sequence[int], num_cells: int, chunk_size: int) -> slice | None:
    n = -(-num_cells // chunk_size)
    first = chunk_ids[0]
    if all(chunk_ids[i] == first + i for i in range(1, n)):
        return slice(first * chunk_size, first * chunk_size + num_cells)
    return None

class ChunkCells:
    """Flat cell indices of chunk tables, kept across steps.

    A table changes only when it gains a chunk, so a lane's index is computed once per
    chunk it grows and read as a prefix view every other step (LRU over `capacity` tables).
    """

    def __init__(
        self, chunk_size: int, num_cells: int | None = None, capacity: int = 64, runs_min_cells: int = 1024
    ):
        self.chunk_size = chunk_size
        # Cells in the storage (bounds strided reads). None: no strided or by-run reads (the
        # gather only), as on accelerators, where those reads are untested.
        self.num_cells = num_cells
        self.capacity = capacity
        self.runs_min_cells = runs_min_cells  # a lane this long, in few runs, is read run by run
        self._tables: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self._offsets = torch.arange(chunk_size)

    def cells(self, chunk_ids: tuple[int, ...], num_cells: int) -> torch.Tensor:
        """[num_cells] flat cells of positions 0..num_cells-1 (a view: do not modify)."""
        flat = self._tables.get(chunk_ids)
        if flat is None:
            chunks = torch.tensor(chunk_ids, dtype=torch.long)
            flat = (chunks.unsqueeze(1) * self.chunk_size + self._offsets).view(-1)
            self._tables[chunk_ids] = flat
            if len(self._tables) > self.capacity:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(chunk_ids)
        return flat[:num_cells]


@dataclass(frozen=True)
class Strided:
    order: list[int]  # the rows in storage address order
    first: int  # the first row's first cell
    distance: int  # cells between consecutive slots
    slots: list[int]  # each row's slot (in `order`); slots between rows are read and discarded


def strided_slots(rows: Sequence[LaneWork], max_cells: int, cells: ChunkCells) -> Strided | None:
    """How to read `rows` through one strided view: each row's cells contiguous, their starts
    on a grid of fixed distance with at most as many empty slots as rows (a lane not decoding
    this step leaves one), and every padded read inside the storage; else None."""
    slices = [contiguous(w.chunk_ids, w.num_cells, cells.chunk_size) for w in rows]
    if any(s is None for s in slices) or cells.num_cells is None:
        return None
    order = sorted(range(len(rows)), key=lambda r: slices[r].start)
    starts = [slices[r].start for r in order]
    distance = math.gcd(*(b - a for a, b in itertools.pairwise(starts)))
    if distance <= 0:
        return None
    slots = [(x - starts[0]) // distance for x in starts]
    assert len(set(slots)) == len(slots), "two decoding lanes start at one cell"  # a shared write chunk
    if slots[-1] + 1 > 2 * len(rows) or starts[-1] + max_cells > cells.num_cells:
        return None
    return Strided(order, starts[0], distance, slots)


# A long lane in at most MAX_RUNS contiguous runs is read run by run; in more, only while its
# runs average MIN_RUN_CELLS cells or more, else it is gathered. On CPU one more run costs one
# attention call (~35 us) and gathering costs ~0.5 us a cell (measured: 32K cells in 128 runs
# read run by run in 0.7x the gather's time, 8K cells in 128 runs of 64 in 1.7x).
MAX_RUNS = 8
MIN_RUN_CELLS = 256


def chunk_runs(chunk_ids: Sequence[int], num_cells: int, chunk_size: int) -> list[slice]:
    """The flat cells of a table's first `num_cells` positions as runs of consecutive chunks."""
    c = chunk_size
    ids = chunk_ids[: -(-num_cells // c)]
    runs: list[slice] = []
    first = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            runs.append(slice(ids[first] * c, ids[i - 1] * c + c))
            first = i
    runs[-1] = slice(runs[-1].start, runs[-1].stop - (len(ids) * c - num_cells))
    return runs


def runs_of(w: LaneWork, cells: ChunkCells) -> tuple[slice, ...] | None:
    """A long lane's cells as contiguous runs of storage, when it is read run by run
    (no copy of its K/V) rather than gathered; None otherwise."""
    if cells.num_cells is None or w.num_cells < cells.runs_min_cells:
        return None
    runs = chunk_runs(w.chunk_ids, w.num_cells, cells.chunk_size)
    if len(runs) < 2 or (len(runs) > MAX_RUNS and w.num_cells < MIN_RUN_CELLS * len(runs)):
        return None
    return tuple(runs)


def split_for_rows(
    runs: tuple[slice, ...], num_cells: int, num_rows: int
) -> tuple[tuple[slice, ...], tuple[torch.Tensor | None, ...]]:
    """The runs re-cut so that every row sees all of each run but the last few, and which
    cells of those each row sees ([rows, cells] bool, at most `num_rows` cells; None: all):
    the rows are the last `num_rows` of `num_cells` positions, each seeing up to its own."""
    first = num_cells - num_rows  # the first new row's position
    cut: list[slice] = []
    masks: list[torch.Tensor | None] = []
    pos = 0
    for run in runs:
        n = run.stop - run.start
        seen = min(n, max(0, first + 1 - pos))  # cells every new row sees
        if seen:
            cut.append(slice(run.start, run.start + seen))
            masks.append(None)
        if seen < n:
            cut.append(slice(run.start + seen, run.stop))
            masks.append(torch.arange(pos + seen, pos + n) <= torch.arange(first, num_cells).unsqueeze(1))
        pos += n
    return tuple(cut), tuple(masks)

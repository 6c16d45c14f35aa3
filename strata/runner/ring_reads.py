"""Attention addressing through the ring: where each lane's cells are read and written.

Cells are in the ring's virtual space (cells/ring_cells.py): a page read in place sits at its
arena slot, a streamed page at its staging slot. A lane's pages whose virtual cells
continue each other form one run; a lane in one run is read in place like a contiguous
lane, a lane in several runs run by run, merged by log-sum-exp (`DecodeRuns`,
`PrefillRuns`). Runs never cross from the arena into staging.
"""

from __future__ import annotations

from collections.abc import Sequence

from strata.cells.ring_step import PageMap, RingStep
from strata.models.attention import AttentionMeta
from strata.models.cell_reads import DecodeContiguous, DecodeRuns, PrefillContiguous, PrefillRuns
from strata.runner.reads import split_for_rows
from strata.runner.windows import window_metas
from strata.step import LaneWork


def lane_runs(pages: Sequence[int], num_cells: int, page: int, where: PageMap) -> tuple[slice, ...]:
    """The virtual cells of positions 0..num_cells-1 as runs, in position order."""
    runs: list[list[int]] = []
    boundary = where.num_arena_cells
    for i, p in enumerate(pages):
        start = where.start[p]
        n = min(page, num_cells - i * page)
        if runs and runs[-1][1] == start and (start != boundary):
            runs[-1][1] += n
        else:
            runs.append([start, start + n])
    return tuple(slice(a, b) for a, b in runs)


def ring_metas(work: Sequence[LaneWork], step: RingStep,
               windows: Sequence[int] = ()) -> dict[int | None, AttentionMeta]:
    """The step's addressing through the ring per window (None: full attention; each of
    `windows`: reads cut to it, runner/windows.py)."""
    ring, where = step.ring, step.pages
    return window_metas(ring_meta(work, step), work, windows,
                        lambda w: lane_runs(ring.lane_pages(w), w.num_cells, ring.page, where))


def ring_meta(work: Sequence[LaneWork], step: RingStep) -> AttentionMeta:
    """`work` in row order (decode rows first, then pieces), as build_inputs orders
    it; the step's virtual write index already follows that order."""
    ring, where = step.ring, step.pages
    page = ring.page
    decode, prefills = [], []
    row = 0
    for w in work:
        runs = lane_runs(ring.lane_pages(w), w.num_cells, page, where)
        n = len(w.token_ids)
        if w.reads_as_decode:
            decode.append(DecodeContiguous(row, runs[0]) if len(runs) == 1 else DecodeRuns(row, runs))
        elif len(runs) == 1:
            prefills.append(PrefillContiguous(row, row + n, runs[0]))
        else:
            prefills.append(PrefillRuns(row, row + n, *split_for_rows(runs, w.num_cells, n)))
        row += n
    return AttentionMeta(step.write_index, tuple(decode), tuple(prefills))

"""Attention addressing through the ring: where each lane's cells are read and written.

Cells are in the ring's virtual space (cells/ring_cells.py): a page read in place sits at its
arena slot, a streamed page at its staging slot. A lane's pages whose virtual cells
continue each other form one run; a lane in one run is read in place like a contiguous
lane, a lane in several runs run by run, merged by log-sum-exp (`DecodeRuns`,
`PrefillRuns`). Runs never cross from the arena into staging. With the fused decode
attention every decode row is read in one call over the arena's and staging's storage
(`DecodeSpans`, `RingCells.kernel_reads`), resident and streamed pages alike, as it reads the
pool without a ring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from strata.cells.ring_groups import GroupedStep
from strata.cells.ring_step import PageMap, RingStep
from strata.models.attention import AttentionMeta
from strata.models.cell_reads import DecodeContiguous, DecodeRuns, DecodeSpans, PrefillContiguous, PrefillRuns
from strata.runner.inputs import VERIFY_MAX_ROWS, spans_read_piece
from strata.runner.reads import split_for_rows
from strata.runner.windows import cut_meta, runs_from, window_metas
from strata.step import LaneWork


def lane_runs(pages: Sequence[int], num_cells: int, page: int, where: PageMap,
              first_page: int = 0) -> tuple[slice, ...]:
    """The virtual cells of positions first_page * page .. num_cells-1 (`pages` from that page
    on) as runs, in position order."""
    runs: list[list[int]] = []
    boundary = where.num_arena_cells
    for i, p in enumerate(pages, start=first_page):
        start = where.start[p]
        n = min(page, num_cells - i * page)
        if runs and runs[-1][1] == start and (start != boundary):
            runs[-1][1] += n
        else:
            runs.append([start, start + n])
    return tuple(slice(a, b) for a, b in runs)


def ring_metas(work: Sequence[LaneWork], step: GroupedStep, windows: Sequence[int] = (),
               kernel: Callable | None = None, max_row_cells: int | None = None) -> dict[int | None, AttentionMeta]:
    """The step's addressing through the ring per window (None: full attention). With one ring
    (one layer group): each of `windows` reads the full addressing cut to it (runner/windows.py).
    With a ring per group: each windowed group's own pages, from its window's first page, cut
    to the window. `kernel`: the fused decode attention, which reads every decode row (arena
    and staging runs in one call); None: run by run. `max_row_cells`: as build_inputs'."""
    full = step.steps[0]
    ring = full.ring

    def runs(w: LaneWork) -> tuple[slice, ...]:
        return lane_runs(ring.lane_pages(w), w.num_cells, ring.page, full.pages)

    if len(step.steps) == 1:  # windowed layers cut reads per lane: there a verify step's rows are pieces
        return window_metas(ring_meta(work, full, kernel, verify_rows=not windows, max_row_cells=max_row_cells),
                            work, windows, runs, kernel)
    metas: dict[int | None, AttentionMeta] = {}
    if ring.layers:
        metas[None] = ring_meta(work, full, kernel, max_row_cells=max_row_cells)
    for s in step.steps[1:]:
        metas[s.ring.window] = _window_meta(work, s, kernel)
    return metas


def _window_meta(work: Sequence[LaneWork], step: RingStep, kernel: Callable | None) -> AttentionMeta:
    """A windowed group's addressing through its ring: its reads cut to its window."""
    ring = step.ring

    def runs(w: LaneWork) -> tuple[slice, ...]:
        return lane_runs(ring.lane_pages(w), w.num_cells, ring.page, step.pages, ring.first_page(w))

    def runs_after(w: LaneWork, first: int) -> tuple[slice, ...]:
        return runs_from(runs(w), first - ring.first_page(w) * ring.page)

    return cut_meta(step.write_index, work, ring.window, runs_after, kernel)


def first_cells(runs: Sequence[slice], n: int) -> list[tuple[int, int]]:
    """(start, cells) spans of the first `n` positions of `runs` (in position order)."""
    spans = []
    for r in runs:
        if n <= 0:
            break
        take = min(n, r.stop - r.start)
        spans.append((r.start, take))
        n -= take
    return spans


def ring_meta(work: Sequence[LaneWork], step: RingStep, kernel: Callable | None = None,
              verify_rows: bool = False, max_row_cells: int | None = None) -> AttentionMeta:
    """`work` in row order (decode rows first, then pieces), as build_inputs orders
    it; the step's virtual write index already follows that order. `kernel`: every decode
    row through the fused decode attention, over arena and staging runs alike; with
    `verify_rows` also a verify step's few rows and prompt pieces the decode kernel reads
    (runner/inputs.py `spans_read_piece`) that follow them, each row over the cells up to its own (as runner/inputs.py reads them
    without a ring: the kernel's blocks are positions, so the two reads are bit-identical)."""
    ring, where = step.ring, step.pages
    page = ring.page
    decode, prefills = [], []
    spans: list[tuple[int, int]] = []
    row_spans = [0]
    row = 0
    for w in work:
        runs = lane_runs(ring.lane_pages(w), w.num_cells, page, where)
        n = len(w.token_ids)
        few = verify_rows and (spans_read_piece(n, w.num_cells, max_row_cells) if w.prompt else n <= VERIFY_MAX_ROWS)
        if kernel is not None and (w.reads_as_decode or few) and row == len(row_spans) - 1:
            for seen in range(w.start + 1, w.num_cells + 1):  # one row per token: cells 0 .. its own
                spans += first_cells(runs, seen)
                row_spans.append(len(spans))
        elif w.reads_as_decode:
            decode.append(DecodeContiguous(row, runs[0]) if len(runs) == 1 else DecodeRuns(row, runs))
        elif len(runs) == 1:
            prefills.append(PrefillContiguous(row, row + n, runs[0]))
        else:
            prefills.append(PrefillRuns(row, row + n, *split_for_rows(runs, w.num_cells, n)))
        row += n
    if len(row_spans) > 1:
        decode.append(DecodeSpans(0, len(row_spans) - 1, torch.tensor(spans, dtype=torch.long),
                                  torch.tensor(row_spans, dtype=torch.long), kernel))
    return AttentionMeta(step.write_index, tuple(decode), tuple(prefills))

"""Attention addressing through the ring: where each lane's cells are read and written.

Cells are in the ring's virtual space (cells/ring_cells.py): a page read in place sits at its
arena slot, a streamed page at its staging slot. A lane's pages whose virtual cells
continue each other form one run; a lane in one run is read in place like a contiguous
lane, a lane in several runs run by run, merged by log-sum-exp (`DecodeRuns`,
`PrefillRuns`). Runs never cross from the arena into staging. Where every decode row's runs
are in the arena (the shallow tier: nothing streamed), the fused decode attention reads them
all in one call over the arena's storage (`DecodeSpans`), as it reads the pool without a ring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from strata.cells.ring_step import PageMap, RingStep
from strata.models.attention import AttentionMeta
from strata.models.cell_reads import DecodeContiguous, DecodeRuns, DecodeSpans, PrefillContiguous, PrefillRuns
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


def ring_metas(work: Sequence[LaneWork], step: RingStep, windows: Sequence[int] = (),
               kernel: Callable | None = None) -> dict[int | None, AttentionMeta]:
    """The step's addressing through the ring per window (None: full attention; each of
    `windows`: reads cut to it, runner/windows.py). `kernel`: the fused decode attention;
    it reads every decode row in place when all of their runs are in the arena (nothing
    streamed for them: the ring's shallow tier), else the rows are read run by run."""
    ring, where = step.ring, step.pages

    def runs(w: LaneWork) -> tuple[slice, ...]:
        return lane_runs(ring.lane_pages(w), w.num_cells, ring.page, where)

    decoding = [w for w in work if w.reads_as_decode]
    if kernel is not None and not all(r.stop <= where.num_arena_cells for w in decoding for r in runs(w)):
        kernel = None
    return window_metas(ring_meta(work, step, kernel), work, windows, runs, kernel)


def ring_meta(work: Sequence[LaneWork], step: RingStep, kernel: Callable | None = None) -> AttentionMeta:
    """`work` in row order (decode rows first, then pieces), as build_inputs orders
    it; the step's virtual write index already follows that order. `kernel`: every decode
    row through the fused decode attention (its runs all in the arena: ring_metas checks)."""
    ring, where = step.ring, step.pages
    page = ring.page
    decode, prefills = [], []
    spans: list[tuple[int, int]] = []
    row_spans = [0]
    row = 0
    for w in work:
        runs = lane_runs(ring.lane_pages(w), w.num_cells, page, where)
        n = len(w.token_ids)
        if w.reads_as_decode and kernel is not None:
            spans += [(r.start, r.stop - r.start) for r in runs]
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

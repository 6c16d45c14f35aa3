"""The addressing of sliding-window layers: one step's reads cut to each row's window.

A row at position p of a layer with window W reads cells max(0, p - W + 1) .. p (as
transformers' sliding-window mask). Every cell is still stored and written (the write
index is the full addressing's); only the reads change. A decode row reads the last W
cells of its lane, in place (one run, a few runs merged by log-sum-exp, or the fused
kernel's spans starting at the window); a prefill piece (or a verify step's drafts) reads
from its first row's window start, run by run under a banded causal mask.

A lane's cells are given as runs of storage in position order (`LaneRuns`): flat pool
cells (runner/reads.py chunk_runs), or the ring's virtual cells (runner/ring_reads.py).

With layer groups (kv/groups.py) a windowed group's layers have their own storage and
their own chunk ids (`LaneWork.window_ids`): `group_metas` writes and reads each group
through its own table, and asserts it never reads or writes a released chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from strata.models.attention import AttentionMeta
from strata.models.cell_reads import DecodeContiguous, DecodeRead, DecodeRuns, DecodeSpans, PrefillRead, PrefillRuns
from strata.step import LaneWork

LaneRuns = Callable[[LaneWork], Sequence[slice]]  # a lane's cells of positions 0..num_cells-1, as runs


def runs_from(runs: Sequence[slice], first: int) -> tuple[slice, ...]:
    """`runs` (positions 0.. in order) without the cells of positions before `first`."""
    out: list[slice] = []
    pos = 0
    for r in runs:
        n = r.stop - r.start
        if pos + n > first:
            out.append(slice(r.start + max(0, first - pos), r.stop))
        pos += n
    return tuple(out)


def band_masks(runs: Sequence[slice], first: int, start: int, num_cells: int,
               window: int) -> tuple[torch.Tensor | None, ...]:
    """Per run (positions from `first` on): [rows, run cells] bool, the row at position p
    (rows are positions start..num_cells-1) seeing position q when p - window < q <= p;
    None where every row sees the whole run."""
    rows = torch.arange(start, num_cells).unsqueeze(1)
    masks: list[torch.Tensor | None] = []
    pos = first
    for r in runs:
        n = r.stop - r.start
        q = torch.arange(pos, pos + n)
        seen = (q <= rows) & (q > rows - window)
        masks.append(None if bool(seen.all()) else seen)
        pos += n
    return tuple(masks)


def window_meta(full: AttentionMeta, work: Sequence[LaneWork], window: int, lane_runs: LaneRuns,
                kernel: Callable | None = None) -> AttentionMeta:
    """The addressing of layers with `window`, beside `full` (the step's addressing for full
    attention, whose rows and write index it keeps). `work` in row order: decode rows
    (`LaneWork.reads_as_decode`) first, then pieces. `kernel`: the fused decode attention, which
    then reads every decode row (as `full` does). Where no row reaches past its window,
    `full` itself."""
    if all(w.num_cells <= window for w in work):
        return full
    return cut_meta(full.write_index, work, window, lambda w, first: runs_from(lane_runs(w), first), kernel)


def cut_meta(write_index: torch.Tensor, work: Sequence[LaneWork], window: int,
              runs_after: Callable[[LaneWork, int], tuple[slice, ...]], kernel: Callable | None) -> AttentionMeta:
    """Reads cut to `window`; `runs_after(w, first)`: lane w's cells of positions first.. as runs."""
    decoding = [w for w in work if w.reads_as_decode]
    decode: list[DecodeRead] = []
    if kernel is not None and decoding:
        spans: list[tuple[int, int]] = []
        row_spans = [0]
        for w in decoding:
            spans += [(r.start, r.stop - r.start) for r in runs_after(w, max(0, w.num_cells - window))]
            row_spans.append(len(spans))
        decode.append(DecodeSpans(0, len(decoding), torch.tensor(spans, dtype=torch.long),
                                  torch.tensor(row_spans, dtype=torch.long), kernel))
    else:
        for row, w in enumerate(decoding):
            runs = runs_after(w, max(0, w.num_cells - window))
            decode.append(DecodeContiguous(row, runs[0]) if len(runs) == 1 else DecodeRuns(row, runs))
    prefills: list[PrefillRead] = []
    row = len(decoding)
    for w in work[len(decoding):]:
        n = len(w.token_ids)
        first = max(0, w.start - window + 1)  # the first row's window start
        runs = runs_after(w, first)
        prefills.append(PrefillRuns(row, row + n, runs, band_masks(runs, first, w.start, w.num_cells, window)))
        row += n
    return AttentionMeta(write_index, tuple(decode), tuple(prefills))


def group_runs(ids: Sequence[int | None], num_cells: int, chunk_size: int, first: int) -> tuple[slice, ...]:
    """A windowed group's cells of positions first..num_cells-1 as runs of consecutive chunks;
    every chunk read must be held (a released chunk is never read)."""
    c = chunk_size
    runs: list[list[int]] = []
    for j in range(first // c, -(-num_cells // c)):
        i = ids[j]
        assert i is not None, f"a read of released chunk {j} (positions {first}..{num_cells - 1})"
        lo = i * c + (first - j * c if j == first // c else 0)
        hi = i * c + min(c, num_cells - j * c)
        if runs and runs[-1][1] == lo:
            runs[-1][1] = hi
        else:
            runs.append([lo, hi])
    return tuple(slice(a, b) for a, b in runs)


def group_write_index(work: Sequence[LaneWork], group: int, chunk_size: int) -> torch.Tensor:
    """[tokens] each new token's flat cell in windowed group `group` (1..), rows in order."""
    c = chunk_size
    cells: list[int] = []
    for w in work:
        ids = w.window_ids[group - 1]
        for p in range(w.start, w.num_cells):
            i = ids[p // c]
            assert i is not None, f"a write into released chunk {p // c}"
            cells.append(i * c + p % c)
    return torch.tensor(cells, dtype=torch.long)


def group_metas(full: AttentionMeta, work: Sequence[LaneWork], windows: Sequence[int], chunk_size: int,
                kernel: Callable | None = None) -> dict[int | None, AttentionMeta]:
    """The step's addressing per layer group: None (full attention) -> `full`; window of group
    g (1.., `windows[g - 1]`) -> writes and reads through the lanes' `window_ids[g - 1]`."""
    metas: dict[int | None, AttentionMeta] = {None: full}
    for g, window in enumerate(windows, start=1):
        def runs_after(w: LaneWork, first: int, g: int = g) -> tuple[slice, ...]:
            return group_runs(w.window_ids[g - 1], w.num_cells, chunk_size, first)
        metas[window] = cut_meta(group_write_index(work, g, chunk_size), work, window, runs_after, kernel)
    return metas


def window_metas(full: AttentionMeta, work: Sequence[LaneWork], windows: Sequence[int], lane_runs: LaneRuns,
                 kernel: Callable | None = None) -> dict[int | None, AttentionMeta]:
    """The step's addressing per window: None (full attention) -> `full`, each of `windows`
    -> its cut reads (`window_meta`)."""
    metas: dict[int | None, AttentionMeta] = {None: full}
    for window in windows:
        metas[window] = window_meta(full, work, window, lane_runs, kernel)
    return metas

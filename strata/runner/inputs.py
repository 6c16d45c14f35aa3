"""One step's batched inputs, built from the scheduler's lane work (once per device)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from strata.step import LaneWork
from strata.models.attention import AttentionMeta
from strata.models.rows import RowKinds
from strata.models.cell_reads import (
    DecodeContiguous,
    DecodeGather,
    DecodeRead,
    DecodeRuns,
    DecodeSpans,
    DecodeStrided,
    PrefillContiguous,
    PrefillGather,
    PrefillRuns,
    PrefillSpans,
)
from strata.runner.reads import ChunkCells, chunk_runs, contiguous, runs_of, split_for_rows, strided_slots
from strata.models.packed import cpu_amx
from strata.runner.windows import group_metas, window_metas


@dataclass(frozen=True)
class StepInputs:
    work: tuple[LaneWork, ...]  # in row order: decode rows (one token), verify/feed rows, then prompt pieces
    input_ids: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens]
    meta: AttentionMeta  # the addressing of full-attention layers (and the write index of all)
    logits_rows: torch.Tensor  # [samples] the last row of each lane that samples (1 + drafts rows when it has drafts)
    sample_work: tuple[LaneWork, ...]  # the lanes behind logits_rows, in order
    # window -> the addressing of layers with it; None -> `meta` (runner/windows.py)
    metas: dict[int | None, AttentionMeta]
    kinds: RowKinds  # which token rows and logits rows are decoding lanes' (the rest: prompt pieces')


VERIFY_MAX_ROWS = 8
# A prompt piece of at most this many rows is read by the fused decode kernel, each row over its
# cells; a longer one by SDPA's causal flash attention, whose tiles reuse keys across rows and
# win there (docs/benchmarks.md, "Prompt rows through the decode kernel").
SPANS_MAX_PROMPT_ROWS = 1024
# Where SDPA's bfloat16 flash attention runs on AMX tiles it wins far earlier: there a piece is
# read by the decode kernel only while its rows times its cells stay within this (a retry's
# last row, a short prompt); a 512-token prompt alone went from 2,420 to 3,500 tok/s and a
# 48-row piece over ~300 cells beside 7 decoding lanes from 48 to 44 ms a step (2 threads,
# a Sapphire Rapids-class guest); below it the decode kernel still won by 1-2 ms.
SPANS_MAX_ROW_CELLS_AMX = 8192
# Where strata's AMX prompt attention reads pieces (`prompt_kernel`), the decode kernel keeps only
# pieces of at most this many rows: the prompt kernel was the faster from 16 rows at every length
# tried (64-1,024 cells), the decode kernel at 8 (docs/benchmarks.md, "Prompt attention on AMX tiles").
SPANS_MAX_ROWS_BESIDE_PROMPT_KERNEL = 12


def spans_max_row_cells(dtype: torch.dtype) -> int | None:
    """The rows x cells bound on a prompt piece read by the decode kernel, for compute in
    `dtype` on this CPU: SPANS_MAX_ROW_CELLS_AMX for bfloat16 where the CPU has AMX, else none."""
    return SPANS_MAX_ROW_CELLS_AMX if dtype == torch.bfloat16 and cpu_amx() else None


def spans_read_piece(rows: int, num_cells: int, max_row_cells: int | None) -> bool:
    """Whether a prompt piece of `rows` rows ending at cell `num_cells` is read by the decode
    kernel, each row over its cells (else by SDPA, its sampling row alone)."""
    return rows <= SPANS_MAX_PROMPT_ROWS and (max_row_cells is None or rows * num_cells <= max_row_cells)


def _write_cells(w: LaneWork, chunk_size: int) -> list[int]:
    """Flat cells the lane's new tokens are written to."""
    return [w.chunk_ids[p // chunk_size] * chunk_size + p % chunk_size for p in range(w.start, w.num_cells)]




def _decode_groups(decode: Sequence[LaneWork], cells: ChunkCells) -> tuple[list[LaneWork], tuple[DecodeRead, ...]]:
    """Decode rows (sorted by length) in groups padded to their longest lane; returns the
    rows in their final order and the groups.

    A group never pads a lane to more than twice its own length, so one long lane does
    not make every short lane gather and attend over its length. A group whose lanes sit
    evenly spaced in storage (the reserved layout; pool lanes that each fit in one chunk)
    reads them through one strided view, in address order, instead of gathering them. A
    long lane in a few runs of chunks (a pool conversation that grew past other lanes'
    chunks) is a group of its own, read run by run.
    """
    ordered: list[LaneWork] = []
    groups: list[DecodeRead] = []
    runs = [runs_of(w, cells) for w in decode]
    start = 0
    while start < len(decode):
        if runs[start] is not None:
            ordered.append(decode[start])
            groups.append(DecodeRuns(start, runs[start]))
            start += 1
            continue
        end = start + 1
        while end < len(decode) and decode[end].num_cells <= 2 * decode[start].num_cells and runs[end] is None:
            end += 1
        rows = list(decode[start:end])
        max_cells = rows[-1].num_cells
        strided = strided_slots(rows, max_cells, cells) if len(rows) > 1 else None
        lens = [w.num_cells for w in rows]
        if strided is not None:
            rows = [rows[r] for r in strided.order]
            lens = [max_cells] * (strided.slots[-1] + 1)  # an empty slot attends to anything
            for slot, w in zip(strided.slots, rows):
                lens[slot] = w.num_cells
        ordered += rows
        mask = None
        if min(lens) != max_cells:
            mask = torch.arange(max_cells) < torch.tensor(lens).view(-1, 1, 1, 1)  # [rows or slots, 1, 1, cells]
        one = contiguous(rows[0].chunk_ids, max_cells, cells.chunk_size) if len(rows) == 1 else None
        if one is not None:
            groups.append(DecodeContiguous(start, one))
        elif strided is not None:
            num_slots = strided.slots[-1] + 1
            slots = None if num_slots == len(rows) else torch.tensor(strided.slots, dtype=torch.long)
            groups.append(DecodeStrided(start, len(rows), max_cells, strided.first, strided.distance, num_slots,
                                        slots, mask))
        elif len(rows) == 1:  # the kept index itself: no padding, no copy
            groups.append(DecodeGather(start, 1, max_cells, cells.cells(rows[0].chunk_ids, max_cells), None))
        else:
            index = torch.zeros(len(rows), max_cells, dtype=torch.long)
            for r, w in enumerate(rows):
                index[r, : w.num_cells] = cells.cells(w.chunk_ids, w.num_cells)
            groups.append(DecodeGather(start, len(rows), max_cells, index.view(-1), mask))
        start = end
    return ordered, tuple(groups)


def _row_spans(w: LaneWork, chunk_size: int, spans: list[tuple[int, int]], row_spans: list[int]) -> None:
    """Appends each of the lane's rows' spans: row i (position start + i) sees cells 0..start + i,
    its own included, as runs of consecutive chunks in position order (the step's K/V is
    written before any row attends)."""
    runs = [(r.start, r.stop - r.start) for r in chunk_runs(w.chunk_ids, w.num_cells, chunk_size)]
    k, before = 0, 0  # the run holding the row's last cell, and the positions before it
    for seen in range(w.start + 1, w.num_cells + 1):
        while before + runs[k][1] < seen:
            before += runs[k][1]
            k += 1
        spans += runs[:k]
        spans.append((runs[k][0], seen - before))
        row_spans.append(len(spans))


def _spans_read(work: Sequence[LaneWork], row: int, chunk_size: int, kernel: Callable) -> DecodeSpans:
    """The rows of `work` (rows from `row` on, in order) in one read of the fused decode kernel."""
    spans: list[tuple[int, int]] = []
    row_spans = [0]
    for w in work:
        _row_spans(w, chunk_size, spans, row_spans)
    return DecodeSpans(row, len(row_spans) - 1, torch.tensor(spans, dtype=torch.long),
                       torch.tensor(row_spans, dtype=torch.long), kernel)


def _sample_read(w: LaneWork, row: int, cells: ChunkCells, kernel: Callable | None) -> DecodeRead:
    """A prompt's sampling row (`row`, its last) as one query over all of its cells, summed in
    position order whatever the lane's layout: through the fused decode kernel over its runs of
    chunks (its blocks are positions, not runs), else over its cells gathered into one tensor.
    So a cold prompt's last row and a retry's one-row piece (its prefix cached, its table's
    last chunk perhaps a copy) attend bit-identically (models/rows.py)."""
    if kernel is not None:
        spans = [(r.start, r.stop - r.start) for r in chunk_runs(w.chunk_ids, w.num_cells, cells.chunk_size)]
        return DecodeSpans(row, 1, torch.tensor(spans, dtype=torch.long),
                           torch.tensor([0, len(spans)], dtype=torch.long), kernel)
    return DecodeGather(row, 1, w.num_cells, cells.cells(w.chunk_ids, w.num_cells), None)


def _fused_rows(w: LaneWork) -> bool:
    """A decoding lane the fused decode kernel reads row by row: one token, or a verify
    step's few rows."""
    return not w.prompt and len(w.token_ids) <= VERIFY_MAX_ROWS


def build_inputs(work: Sequence[LaneWork], cells: ChunkCells, decode_kernel: Callable | None = None,
                 windows: Sequence[int] = (), grouped: bool = False,
                 max_row_cells: int | None = None, prompt_kernel: Callable | None = None) -> StepInputs:
    """`decode_kernel`: the fused decode attention where the model and K/V allow it (runner);
    then every decoding lane is read through it (`DecodeSpans`), else by the groups above.
    `windows`: the model's distinct sliding windows, each given its own addressing; `grouped`:
    each is a layer group with its own storage, read through the lanes' `window_ids`.
    `max_row_cells`: the rows x cells bound on a prompt piece the decode kernel reads
    (`spans_max_row_cells`; None: SPANS_MAX_PROMPT_ROWS alone). `prompt_kernel`: the AMX prompt
    attention (llama.py `prompt_attention_kernel`), which then reads every prompt piece of more
    than SPANS_MAX_ROWS_BESIDE_PROMPT_KERNEL rows (in place of that bound) over its runs of
    chunks in place (`PrefillSpans`; its sampling row still read alone)."""
    chunk_size = cells.chunk_size
    # Windowed layers cut their reads per lane (windows.py), one row per decoding lane: a verify
    # step's rows are pieces there.
    fused = decode_kernel is not None and not windows
    decoding = [w for w in work if (_fused_rows(w) if fused else w.reads_as_decode)]
    if decode_kernel is not None and decoding:
        decode, decode_groups = decoding, (_spans_read(decoding, 0, chunk_size, decode_kernel),)
    else:
        decode, decode_groups = _decode_groups(sorted(decoding, key=lambda w: w.num_cells), cells)
    # Pieces, each attending alone: a decoding lane's several rows (verify, a draft model's feed)
    # before the prompt pieces, so that every decode row precedes every prompt row (RowKinds).
    in_decode = {id(w) for w in decode}
    prefill = [w for w in work if id(w) not in in_decode and not w.prompt] + [w for w in work if w.prompt]
    ordered = tuple(decode + prefill)
    ids: list[int] = []
    positions: list[int] = []
    writes: list[int] = []
    for w in ordered:
        ids.extend(w.token_ids)
        positions.extend(range(w.start, w.num_cells))
        writes.extend(_write_cells(w, chunk_size))

    prefills, samples, pieces = [], [], []
    row = sum(len(w.token_ids) for w in decode)
    for w in prefill:
        n = len(w.token_ids)
        few = (n <= SPANS_MAX_ROWS_BESIDE_PROMPT_KERNEL if prompt_kernel is not None
               else spans_read_piece(n, w.num_cells, max_row_cells))
        if fused and w.prompt and few:
            # Every row of the piece as one query over its cells, as a decoding lane's: so its
            # sampling row is read as a retry's one-row piece would be (no separate sample read).
            pieces.append(_spans_read([w], row, chunk_size, decode_kernel))
            row += n
            continue
        if w.prompt and w.do_sample:
            samples.append(_sample_read(w, row + n - 1, cells, decode_kernel))
            if n == 1:  # the sampling row alone: no piece read
                row += n
                continue
        if prompt_kernel is not None and w.prompt and not windows:
            spans = [(r.start, r.stop - r.start) for r in chunk_runs(w.chunk_ids, w.num_cells, chunk_size)]
            prefills.append(PrefillSpans(row, row + n, torch.tensor(spans, dtype=torch.long), prompt_kernel))
            row += n
            continue
        cell_slice = contiguous(w.chunk_ids, w.num_cells, chunk_size)
        runs = None if cell_slice is not None else runs_of(w, cells)
        if cell_slice is not None and n <= VERIFY_MAX_ROWS < w.num_cells:
            # A few rows over a long lane (a verify step's drafts): the cells every row sees in
            # one grouped read, the last few under a small mask, merged by log-sum-exp; SDPA
            # with a [rows, cells] mask costs about twice as much here (measured, 2 rows).
            prefills.append(PrefillRuns(row, row + n, *split_for_rows((cell_slice,), w.num_cells, n)))
        elif cell_slice is not None:
            prefills.append(PrefillContiguous(row, row + n, cell_slice))
        elif runs is not None:
            prefills.append(PrefillRuns(row, row + n, *split_for_rows(runs, w.num_cells, n)))
        else:
            prefills.append(PrefillGather(row, row + n, cells.cells(w.chunk_ids, w.num_cells)))
        row += n

    sample_rows, sample_work = [], []
    alone: list[int] = []  # a prompt's last row, multiplied on its own (models/rows.py)
    row = decode_rows = decode_logits = 0
    for w in ordered:
        row += len(w.token_ids)
        if w.do_sample:  # the last row; a lane verifying drafts: every row (pending token, drafts)
            sample_rows.extend(range(row - 1 - w.num_drafts, row))
            sample_work.append(w)
            if w.prompt:
                alone.append(row - 1)
        if not w.prompt:
            decode_rows, decode_logits = row, len(sample_rows)
    meta = AttentionMeta(torch.tensor(writes, dtype=torch.long), decode_groups + tuple(pieces), tuple(prefills),
                         tuple(samples))
    if grouped:
        metas = group_metas(meta, ordered, windows, chunk_size, decode_kernel)
    else:
        metas = window_metas(meta, ordered, windows, lambda w: chunk_runs(w.chunk_ids, w.num_cells, chunk_size),
                             decode_kernel)
    return StepInputs(
        ordered,
        torch.tensor(ids, dtype=torch.long),
        torch.tensor(positions, dtype=torch.long),
        meta,
        torch.tensor(sample_rows, dtype=torch.long),
        tuple(sample_work),
        metas,
        RowKinds(decode_rows, decode_logits, tuple(alone), alone_logits=True),
    )

"""The runner's batched inputs: exact cell addressing from chunk tables."""

from __future__ import annotations

import pytest
import torch

from strata.cells.dense import DenseCells
from strata.step import LaneWork
from strata.models.attention import attend
from strata.models.cell_reads import (
    DecodeContiguous,
    DecodeGather,
    DecodeRuns,
    DecodeSpans,
    DecodeStrided,
    PrefillContiguous,
    PrefillGather,
    PrefillRuns,
)
from strata.runner.inputs import build_inputs
from strata.runner.reads import MAX_RUNS, MIN_RUN_CELLS, ChunkCells


def work(lane, tokens, start, chunks, sample=True, prompt=False):
    return LaneWork(lane, f"r{lane}", tuple(tokens), start, tuple(chunks), sample, prompt=prompt)


def test_with_the_fused_kernel_every_decode_row_reads_its_runs_of_chunks():
    """One `DecodeSpans` for all decoding lanes, rows in work order, each lane's chunk table as
    runs of consecutive chunks (the last cut to its cells); a prompt piece's rows in one more,
    each over its cells up to its own (no prefill or sample read)."""
    c = 4
    kernel = object()
    ws = [
        work(0, [11, 12], 0, [9], prompt=True),  # a prefill piece
        work(1, [21], 9, [2, 3, 7]),  # 10 cells: chunks 2-3 in a run, then 2 cells of chunk 7
        work(2, [31], 0, [5]),  # 1 cell
        work(3, [41], 7, [0, 1]),  # 8 cells in one run
    ]
    inp = build_inputs(ws, ChunkCells(c, 64), kernel)
    assert [w.lane for w in inp.work] == [1, 2, 3, 0]
    d, p = inp.meta.decode
    assert isinstance(d, DecodeSpans) and (d.row_start, d.num_rows) == (0, 3) and d.kernel is kernel
    assert d.spans.tolist() == [[8, 8], [28, 2], [20, 1], [0, 8]]
    assert d.row_spans.tolist() == [0, 2, 3, 4]
    assert inp.meta.write_index.tolist()[:3] == [29, 20, 7]
    assert isinstance(p, DecodeSpans) and (p.row_start, p.num_rows) == (3, 2) and p.kernel is kernel
    assert p.spans.tolist() == [[36, 1], [36, 2]] and p.row_spans.tolist() == [0, 1, 2]
    assert inp.meta.prefills == () and inp.meta.samples == ()


def test_with_the_fused_kernel_a_prompt_piece_reads_each_row_over_its_runs():
    """A piece from the middle of a table over several runs: row i sees the runs before the one
    holding its position whole, and that one up to its own cell; a piece longer than
    SPANS_MAX_PROMPT_ROWS is read by SDPA as before, its sampling row alone."""
    from strata.runner.inputs import SPANS_MAX_PROMPT_ROWS

    c = 4
    kernel = object()
    # positions 6..10 of a table over chunks 3, 4 (a run) and 9: cells 12..19, then 36..
    inp = build_inputs([work(0, [1, 2, 3, 4, 5], 6, [3, 4, 9], prompt=True)], ChunkCells(c, 64), kernel)
    (p,) = inp.meta.decode
    assert (p.row_start, p.num_rows) == (0, 5)
    rows = [p.spans[a:b].tolist() for a, b in zip(p.row_spans[:-1].tolist(), p.row_spans[1:].tolist())]
    assert rows == [[[12, 7]], [[12, 8]], [[12, 8], [36, 1]], [[12, 8], [36, 2]], [[12, 8], [36, 3]]]
    assert inp.meta.write_index.tolist() == [18, 19, 36, 37, 38]
    n = SPANS_MAX_PROMPT_ROWS + 1
    long = build_inputs([work(0, list(range(n)), 0, range(-(-n // c)), prompt=True)], ChunkCells(c, 4096), kernel)
    assert long.meta.decode == () and len(long.meta.prefills) == 1 and len(long.meta.samples) == 1


def test_a_row_cells_bound_sends_longer_pieces_to_sdpa_and_keeps_a_retrys_row_on_the_kernel():
    """With `max_row_cells` (bfloat16 on a CPU with AMX), a piece whose rows x cells exceed it
    is read by SDPA with its sampling row alone; a one-row piece (a retry's) stays on the kernel."""
    from strata.runner.inputs import SPANS_MAX_ROW_CELLS_AMX, spans_max_row_cells, spans_read_piece

    c = 4
    kernel = object()
    piece = [work(0, [1, 2, 3, 4, 5], 6, [3, 4, 9], prompt=True)]  # 5 rows ending at cell 11: 55 row-cells
    at = build_inputs(piece, ChunkCells(c, 64), kernel, max_row_cells=55)
    assert [(d.row_start, d.num_rows) for d in at.meta.decode] == [(0, 5)] and at.meta.samples == ()
    over = build_inputs(piece, ChunkCells(c, 64), kernel, max_row_cells=54)
    assert over.meta.decode == () and len(over.meta.prefills) == 1
    (s,) = over.meta.samples
    assert (s.row_start, s.num_rows) == (4, 1)
    retry = build_inputs([work(0, [5], 10, [3, 4, 9], prompt=True)], ChunkCells(c, 64), kernel, max_row_cells=54)
    assert [(d.row_start, d.num_rows) for d in retry.meta.decode] == [(0, 1)] and retry.meta.prefills == ()
    assert spans_read_piece(1, 100_000, SPANS_MAX_ROW_CELLS_AMX) is False
    assert spans_read_piece(1, SPANS_MAX_ROW_CELLS_AMX, SPANS_MAX_ROW_CELLS_AMX)
    assert spans_max_row_cells(torch.float32) is None


def test_decode_rows_come_first_and_address_their_cells():
    c = 4
    ws = [
        work(0, [11, 12, 13], 0, [5, 2]),  # a prefill piece from position 0
        work(1, [21], 6, [0, 3]),  # a decode token at position 6: chunk 3, cell 2
        work(2, [31], 3, [7]),
    ]
    inp = build_inputs(ws, ChunkCells(c))
    assert [w.lane for w in inp.work] == [2, 1, 0]  # decoding lanes shortest first, then prefills
    assert inp.input_ids.tolist() == [31, 21, 11, 12, 13]
    assert inp.positions.tolist() == [3, 6, 0, 1, 2]
    assert inp.meta.write_index.tolist() == [7 * c + 3, 3 * c + 2, 5 * c, 5 * c + 1, 5 * c + 2]
    (d,) = inp.meta.decode  # 4 and 7 cells: within 2x of each other, one padded group
    assert isinstance(d, DecodeGather) and (d.row_start, d.num_rows, d.max_cells) == (0, 2, 7)
    rows = d.cell_index.view(2, 7).tolist()
    assert rows[0][:4] == [28, 29, 30, 31]
    assert rows[1] == [0, 1, 2, 3, 12, 13, 14]  # chunk 0 then chunk 3
    assert d.mask.shape == (2, 1, 1, 7)
    assert d.mask[0, 0, 0].tolist() == [True] * 4 + [False] * 3 and d.mask[1].all()
    (p,) = inp.meta.prefills
    assert p == PrefillContiguous(2, 5, slice(20, 23))  # rows 2..4 over one chunk: read in place
    assert inp.logits_rows.tolist() == [0, 1, 4]


def test_a_long_lane_does_not_pad_the_short_ones():
    c = 8
    ws = [
        work(0, [1], 99, list(range(13))),
        work(1, [2], 3, [20]),
        work(2, [3], 5, [21]),
        work(3, [4], 40, [30, 22, 23, 24, 25, 26]),
    ]
    inp = build_inputs(ws, ChunkCells(c))
    assert [w.lane for w in inp.work] == [1, 2, 3, 0]
    short, mid, long = inp.meta.decode
    assert isinstance(short, DecodeGather) and (short.row_start, short.num_rows, short.max_cells) == (0, 2, 6)
    assert isinstance(mid, DecodeGather) and (mid.row_start, mid.num_rows, mid.max_cells) == (2, 1, 41)
    assert mid.mask is None
    assert long == DecodeContiguous(3, slice(0, 100))  # chunks 0..12 are contiguous


def test_prefill_piece_after_cached_cells_gets_an_offset_causal_mask():
    c = 4
    inp = build_inputs([work(0, [1, 2, 3], 5, [9, 4, 6], sample=False)], ChunkCells(c))  # chunks not contiguous
    (p,) = inp.meta.prefills
    assert isinstance(p, PrefillGather)
    assert p.cell_index.tolist() == [36, 37, 38, 39, 16, 17, 18, 19]
    assert (p.row_start, p.row_end) == (0, 3)  # rows 5..7 of 8 cells
    assert inp.logits_rows.tolist() == [] and inp.sample_work == ()


def test_contiguous_chunks_are_read_in_place():
    c = 4
    inp = build_inputs([work(0, [7], 9, [2, 3, 4])], ChunkCells(c))  # a single decoding lane over chunks 2,3,4
    (d,) = inp.meta.decode
    assert d == DecodeContiguous(0, slice(8, 18))
    two = build_inputs([work(0, [7], 9, [2, 3, 4]), work(1, [8], 0, [0])], ChunkCells(c))
    assert two.meta.decode == (DecodeContiguous(0, slice(0, 1)), DecodeContiguous(1, slice(8, 18)))  # two groups


def test_chunk_cells_are_kept_across_steps():
    cells = ChunkCells(4, capacity=2)
    a = cells.cells((3, 1), 6)
    assert a.tolist() == [12, 13, 14, 15, 4, 5]
    assert cells.cells((3, 1), 7).data_ptr() == a.data_ptr()  # the same table: a view, not recomputed
    cells.cells((0,), 1)
    cells.cells((2,), 1)  # a third table evicts the least recently used, (3, 1)
    assert cells.cells((3, 1), 2).data_ptr() != a.data_ptr()


def test_evenly_spaced_lanes_are_read_through_one_strided_view_in_address_order():
    c = 8
    # one chunk each, 16 cells apart: chunks 4, 0, 2 hold 6, 7 and 5 cells
    ws = [work(0, [1], 5, [4]), work(1, [2], 6, [0]), work(2, [3], 4, [2])]
    inp = build_inputs(ws, ChunkCells(c, num_cells=6 * c))
    (d,) = inp.meta.decode
    assert isinstance(d, DecodeStrided) and (d.first, d.distance, d.num_slots) == (0, 16, 3) and d.slots is None
    assert (d.row_start, d.num_rows, d.max_cells) == (0, 3, 7)
    assert [w.lane for w in inp.work] == [1, 2, 0]  # by address, not by length
    assert inp.input_ids.tolist() == [2, 3, 1] and inp.positions.tolist() == [6, 4, 5]
    assert inp.meta.write_index.tolist() == [6, 16 + 4, 32 + 5]
    assert [w.lane for w in inp.sample_work] == [1, 2, 0] and inp.logits_rows.tolist() == [0, 1, 2]
    assert d.mask[:, 0, 0].tolist() == [[True] * 7, [True] * 5 + [False] * 2, [True] * 6 + [False]]


def test_lanes_on_a_grid_with_gaps_are_read_with_empty_slots_between():
    c = 8
    ws = [work(0, [1], 5, [4]), work(1, [2], 6, [0]), work(2, [3], 4, [1])]  # at 32, 0, 8
    inp = build_inputs(ws, ChunkCells(c, num_cells=6 * c))
    (d,) = inp.meta.decode
    assert (d.first, d.distance, d.num_slots) == (0, 8, 5) and d.slots.tolist() == [0, 1, 4]
    assert [w.lane for w in inp.work] == [1, 2, 0]
    # one mask row per slot: the empty slots 2 and 3 attend to everything they read
    assert d.mask[:, 0, 0].sum(-1).tolist() == [7, 5, 7, 7, 6]


def test_strided_reads_only_when_few_slots_are_empty_and_reads_stay_in_bounds():
    c = 8
    sparse = [work(0, [1], 5, [10]), work(1, [2], 6, [0]), work(2, [3], 4, [1])]  # 11 slots for 3 rows
    (d,) = build_inputs(sparse, ChunkCells(c, num_cells=12 * c)).meta.decode
    assert isinstance(d, DecodeGather)
    # 16 and 8 cells at 0 and 16: the second row's padded read ends at 32
    ws = [work(0, [1], 15, [0, 1]), work(1, [2], 7, [2])]
    (d,) = build_inputs(ws, ChunkCells(c, num_cells=3 * c)).meta.decode
    assert isinstance(d, DecodeGather)
    (d,) = build_inputs(ws, ChunkCells(c, num_cells=4 * c)).meta.decode
    assert isinstance(d, DecodeStrided) and (d.first, d.distance, d.num_slots) == (0, 16, 2)
    (d,) = build_inputs(ws, ChunkCells(c)).meta.decode  # storage size unknown: gather
    assert isinstance(d, DecodeGather)


@pytest.mark.parametrize("gap", [False, True])
def test_strided_gathered_and_per_lane_decode_attention_agree(gap):
    """The same rows attended through a strided view, a gather, and one lane at a time."""
    torch.manual_seed(0)
    c, kv_heads, heads, dim = 8, 2, 6, 16
    k_cache = torch.randn(kv_heads, 11 * c, dim)
    v_cache = torch.randn(kv_heads, 11 * c, dim)
    last = [9] if gap else [6]  # at 72: slot 3, slot 2 empty; at 48: slot 2
    ws = [work(0, [1], 9, [0, 1]), work(1, [2], 12, [3, 4]), work(2, [3], 7, last)]
    q = torch.randn(3, heads, dim)
    k_new, v_new = torch.randn(3, kv_heads, dim), torch.randn(3, kv_heads, dim)

    def run(cells: ChunkCells, rows: list[LaneWork]) -> dict[int, torch.Tensor]:
        inp = build_inputs(rows, cells)
        order = [ws.index(w) for w in inp.work]
        out = attend(q[order], k_new[order], v_new[order], DenseCells(k_cache.clone()), DenseCells(v_cache.clone()), inp.meta)
        return {w.lane: out[r] for r, w in enumerate(inp.work)}

    strided = run(ChunkCells(c, num_cells=11 * c), ws)
    gathered = run(ChunkCells(c), ws)
    (d,) = build_inputs(ws, ChunkCells(c, num_cells=11 * c)).meta.decode
    assert isinstance(d, DecodeStrided) and (d.first, d.distance, d.num_slots) == ((0, 24, 4) if gap else (0, 24, 3))
    assert (d.slots is not None) == gap
    for lane in range(3):
        alone = run(ChunkCells(c), [ws[lane]])[lane]
        torch.testing.assert_close(strided[lane], gathered[lane], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(strided[lane], alone, rtol=1e-5, atol=1e-5)


def test_a_long_lane_in_a_few_runs_is_read_run_by_run():
    c = 8
    cells = ChunkCells(c, num_cells=40 * c, runs_min_cells=16)
    # 20 cells in chunks 3, 4 | 9; 5 cells in chunk 0; 17 cells in chunks 1, 2 | 5
    ws = [work(0, [1], 19, [3, 4, 9]), work(1, [2], 4, [0]), work(2, [3], 16, [1, 2, 5])]
    inp = build_inputs(ws, cells)
    assert [w.lane for w in inp.work] == [1, 2, 0]
    assert inp.meta.decode == (
        DecodeContiguous(0, slice(0, 5)),  # short: read in place
        DecodeRuns(1, (slice(8, 24), slice(40, 41))),  # 17 cells
        DecodeRuns(2, (slice(24, 40), slice(72, 76))),  # 20 cells
    )
    scattered = work(0, [1], 69, [0, 2, 4, 6, 8, 10, 12, 14, 16])  # 9 runs: gathered
    (d,) = build_inputs([scattered], cells).meta.decode
    assert isinstance(d, DecodeGather)
    (d,) = build_inputs(ws[:1], ChunkCells(c, runs_min_cells=16)).meta.decode  # accelerators: gathered
    assert isinstance(d, DecodeGather)


def test_a_lane_in_many_long_runs_is_read_run_by_run_and_agrees_with_the_gather():
    """Past MAX_RUNS runs, a lane is read run by run only while its runs average MIN_RUN_CELLS
    cells: a pool conversation that grew between other lanes' chunks many times over."""
    torch.manual_seed(3)
    c, kv_heads, heads, dim = MIN_RUN_CELLS, 1, 2, 4
    num_chunks = 2 * (MAX_RUNS + 2)
    k_cache, v_cache = torch.randn(kv_heads, num_chunks * c, dim), torch.randn(kv_heads, num_chunks * c, dim)
    ids = list(range(0, num_chunks, 2))  # MAX_RUNS + 2 runs of one chunk each
    cells = ChunkCells(c, num_cells=num_chunks * c)
    full = work(0, [1], len(ids) * c - 1, ids)  # every run whole: MIN_RUN_CELLS cells on average
    (d,) = build_inputs([full], cells).meta.decode
    assert d == DecodeRuns(0, tuple(slice(i * c, i * c + c) for i in ids))
    short = work(0, [1], len(ids) * c - 2, ids)  # one cell short of that average: gathered
    (d,) = build_inputs([short], cells).meta.decode
    assert isinstance(d, DecodeGather)
    q, k_new, v_new = torch.randn(1, heads, dim), torch.randn(1, kv_heads, dim), torch.randn(1, kv_heads, dim)
    got = attend(q, k_new, v_new, DenseCells(k_cache.clone()), DenseCells(v_cache.clone()), build_inputs([full], cells).meta)
    want = attend(q, k_new, v_new, DenseCells(k_cache.clone()), DenseCells(v_cache.clone()), build_inputs([full], ChunkCells(c)).meta)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_run_by_run_and_gathered_decode_attention_agree():
    torch.manual_seed(1)
    c, kv_heads, heads, dim = 8, 2, 6, 16
    k_cache = torch.randn(kv_heads, 40 * c, dim)
    v_cache = torch.randn(kv_heads, 40 * c, dim)
    ws = [work(0, [1], 19, [3, 4, 9]), work(1, [2], 4, [0]), work(2, [3], 26, [1, 2, 5, 20])]
    q = torch.randn(3, heads, dim)
    k_new, v_new = torch.randn(3, kv_heads, dim), torch.randn(3, kv_heads, dim)

    def run(cells: ChunkCells) -> dict[int, torch.Tensor]:
        inp = build_inputs(ws, cells)
        order = [ws.index(w) for w in inp.work]
        out = attend(q[order], k_new[order], v_new[order], DenseCells(k_cache.clone()), DenseCells(v_cache.clone()), inp.meta)
        return {w.lane: out[r] for r, w in enumerate(inp.work)}

    by_runs = ChunkCells(c, num_cells=40 * c, runs_min_cells=16)
    assert [len(getattr(d, "runs", ())) for d in build_inputs(ws, by_runs).meta.decode] == [0, 2, 3]
    runs, gathered = run(by_runs), run(ChunkCells(c))
    for lane in range(3):
        torch.testing.assert_close(runs[lane], gathered[lane], rtol=1e-5, atol=1e-5)


def test_a_prompt_piece_of_a_long_lane_in_runs_sees_up_to_its_own_cell():
    c = 8
    cells = ChunkCells(c, num_cells=40 * c, runs_min_cells=16)
    (p,) = build_inputs([work(0, [5, 6, 7, 8, 9, 10, 11], 13, [3, 4, 9])], cells).meta.prefills  # rows 13..19
    # every row sees positions 0..13 (cells 24..38); positions 14, 15 and 16..19 by row
    assert isinstance(p, PrefillRuns) and p.runs == (slice(24, 38), slice(38, 40), slice(72, 76))
    everyone, tail, last = p.run_masks
    assert everyone is None and tail.shape == (7, 2) and last.shape == (7, 4)
    assert tail.tolist() == [[False, False], [True, False]] + [[True, True]] * 5  # row 13 sees neither
    assert last[:3].sum().item() == 0  # rows 13..15 see nothing of positions 16..19
    assert last[3:].tolist() == [[j <= i for j in range(4)] for i in range(4)]
    (p,) = build_inputs([work(0, [5, 6], 18, [3, 4, 9])], cells).meta.prefills
    assert p.runs == (slice(24, 40), slice(72, 75), slice(75, 76))
    assert p.run_masks[:2] == (None, None) and p.run_masks[2].tolist() == [[False], [True]]


@pytest.mark.parametrize("start,num_new", [(13, 7), (18, 2), (16, 3), (0, 20)])
def test_run_by_run_and_gathered_prefill_attention_agree(start, num_new):
    torch.manual_seed(2)
    c, kv_heads, heads, dim = 8, 2, 6, 16
    k_cache = torch.randn(kv_heads, 40 * c, dim)
    v_cache = torch.randn(kv_heads, 40 * c, dim)
    w = work(0, list(range(num_new)), start, [3, 4, 9], sample=False)
    q = torch.randn(num_new, heads, dim)
    k_new, v_new = torch.randn(num_new, kv_heads, dim), torch.randn(num_new, kv_heads, dim)
    by_runs = ChunkCells(c, num_cells=40 * c, runs_min_cells=16)
    meta = build_inputs([w], by_runs).meta
    assert isinstance(meta.prefills[0], PrefillRuns)
    got = attend(q, k_new, v_new, DenseCells(k_cache.clone()), DenseCells(v_cache.clone()), meta)
    want = attend(q, k_new, v_new, DenseCells(k_cache.clone()), DenseCells(v_cache.clone()), build_inputs([w], ChunkCells(c)).meta)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

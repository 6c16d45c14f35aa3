"""Sliding-window reads (runner/windows.py): every read path gives each row exactly the cells
max(0, p - W + 1) .. p of its lane, against attention written out over those cells alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.cells.dense import DenseCells
from strata.models.attention import attend_written
from strata.models.cell_reads import DecodeContiguous, DecodeRuns, DecodeSpans, PrefillRuns
from strata.runner.inputs import build_inputs
from strata.runner.reads import ChunkCells
from strata.runner.windows import band_masks, runs_from
from strata.step import LaneWork
from tests.conftest import FUSED_ONLY

KV_HEADS, HEADS, DIM = 2, 4, 16


def test_runs_from_drops_the_cells_before_the_window():
    runs = (slice(8, 16), slice(40, 44), slice(0, 3))  # positions 0-7, 8-11, 12-14
    assert runs_from(runs, 0) == runs
    assert runs_from(runs, 5) == (slice(13, 16), slice(40, 44), slice(0, 3))
    assert runs_from(runs, 8) == (slice(40, 44), slice(0, 3))
    assert runs_from(runs, 13) == (slice(1, 3),)


def test_band_masks_see_the_last_w_positions():
    # rows at positions 10, 11, 12 (window 3) over cells of positions 8.. in runs of 2 and 3
    masks = band_masks((slice(0, 2), slice(5, 8)), 8, 10, 13, 3)
    seen = torch.cat(masks, dim=1).int().tolist()
    assert seen == [[1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    assert band_masks((slice(0, 4),), 4, 7, 8, 4) == (None,)  # one row seeing its whole window


def lane_cells(w: LaneWork, chunk: int) -> list[int]:
    return [w.chunk_ids[p // chunk] * chunk + p % chunk for p in range(w.num_cells)]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ws: list[LaneWork], chunk: int,
              window: int | None) -> torch.Tensor:
    """Each row over its own window's cells, in float64: [rows, heads, dim]."""
    out, row = [], 0
    for w in ws:
        cells = lane_cells(w, chunk)
        for p in range(w.start, w.num_cells):
            lo = 0 if window is None else max(0, p - window + 1)
            idx = torch.tensor(cells[lo : p + 1])
            kk = k[:, idx].double().repeat_interleave(HEADS // KV_HEADS, 0)  # [heads, n, dim]
            vv = v[:, idx].double().repeat_interleave(HEADS // KV_HEADS, 0)
            s = torch.einsum("hd,hnd->hn", q[row].double(), kk) * DIM**-0.5
            out.append(torch.einsum("hn,hnd->hd", s.softmax(-1), vv))
            row += 1
    return torch.stack(out)


lanes_st = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 9)), min_size=1, max_size=4)


def make_work(lanes: list[tuple[int, int]], chunk: int, num_chunks: int, seed: int) -> list[LaneWork]:
    """Lanes (cells before, new tokens) over chunk tables drawn without repeats from the storage."""
    g = torch.Generator().manual_seed(seed)
    free = torch.randperm(num_chunks, generator=g).tolist()
    ws = []
    for i, (before, new) in enumerate(lanes):
        n = -(-(before + new) // chunk)
        ids, free = free[:n], free[n:]
        ws.append(LaneWork(i, f"r{i}", tuple(range(new)), before, tuple(ids), True))
    return ws


@settings(max_examples=25, deadline=None)
@given(lanes=lanes_st, chunk=st.sampled_from([4, 8, 16]), window=st.sampled_from([1, 3, 8, 13]),
       seed=st.integers(0, 1000), runs=st.booleans())
def test_every_torch_read_sees_exactly_its_window(lanes, chunk, window, seed, runs):
    num_chunks = 48
    ws = make_work(lanes, chunk, num_chunks, seed)
    torch.manual_seed(seed)
    k = torch.randn(KV_HEADS, num_chunks * chunk, DIM)
    v = torch.randn(KV_HEADS, num_chunks * chunk, DIM)
    cells = ChunkCells(chunk, num_chunks * chunk, runs_min_cells=1 if runs else 1024)
    inp = build_inputs(ws, cells, None, (window,))
    q = torch.randn(int(inp.input_ids.numel()), HEADS, DIM)
    for win in (None, window):
        got = attend_written(q, DenseCells(k), DenseCells(v), inp.metas[win]).view(-1, HEADS, DIM)
        want = reference(q, k, v, list(inp.work), chunk, win)
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    if all(w.num_cells <= window for w in ws):
        assert inp.metas[window] is inp.meta  # nothing reaches past the window: the same reads
    else:
        m = inp.metas[window]
        assert all(isinstance(d, (DecodeContiguous, DecodeRuns)) for d in m.decode)
        assert all(isinstance(p, PrefillRuns) for p in m.prefills)


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
@settings(max_examples=20, deadline=None)
@given(lanes=st.lists(st.integers(1, 60), min_size=1, max_size=5), chunk=st.sampled_from([4, 8, 16]),
       window=st.sampled_from([1, 5, 8, 16]), seed=st.integers(0, 1000))
def test_the_fused_kernel_spans_start_at_the_window(decode_ops, decode_path, lanes, chunk, window, seed):
    num_chunks = 96
    ws = make_work([(n - 1, 1) for n in lanes], chunk, num_chunks, seed)
    torch.manual_seed(seed)
    k = torch.randn(KV_HEADS, num_chunks * chunk, DIM)
    v = torch.randn(KV_HEADS, num_chunks * chunk, DIM)
    inp = build_inputs(ws, ChunkCells(chunk, num_chunks * chunk), decode_ops.decode_attention, (window,))
    (d,) = inp.metas[window].decode
    assert isinstance(d, DecodeSpans)
    q = torch.randn(len(ws), HEADS, DIM)
    got = attend_written(q, DenseCells(k), DenseCells(v), inp.metas[window]).view(-1, HEADS, DIM)
    torch.testing.assert_close(got.double(), reference(q, k, v, list(inp.work), chunk, window), rtol=1e-4, atol=1e-5)

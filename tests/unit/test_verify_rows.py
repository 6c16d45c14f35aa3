"""A verify step's rows through the fused decode attention (runner/inputs.py): each row reads
the lane's cells up to its own position, and agrees with the rows read as one piece."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from strata.cells.dense import DenseCells
from strata.models.attention import attend
from strata.runner.inputs import build_inputs
from strata.runner.reads import ChunkCells
from strata.step import LaneDrafts, LaneWork


def work(lane, tokens, start, chunks):
    return LaneWork(lane, f"r{lane}", tuple(tokens), start, tuple(chunks), True)


def test_with_the_fused_kernel_a_verify_lane_reads_each_row_up_to_its_own_cell():
    """A verify step's rows (pending token and drafts) are decode rows of the fused kernel:
    row i sees cells 0..start + i, as decoding one token at a time would."""
    c = 4
    verify = replace(work(1, [21, 22, 23], 6, [2, 7, 3]), drafts=LaneDrafts(num_drafts=2))  # cells 6, 7 and 8
    ws = [work(0, [41], 2, [6]), verify]
    inp = build_inputs(ws, ChunkCells(c, 64), object())
    (d,) = inp.meta.decode
    assert (d.num_rows, inp.meta.prefills) == (4, ())
    assert d.spans.tolist() == [[24, 3], [8, 4], [28, 3], [8, 4], [28, 4], [8, 4], [28, 4], [12, 1]]
    assert d.row_spans.tolist() == [0, 1, 3, 5, 8]
    assert inp.positions.tolist() == [2, 6, 7, 8] and inp.meta.write_index.tolist() == [26, 30, 31, 12]
    assert inp.logits_rows.tolist() == [0, 1, 2, 3] and inp.kinds.decode == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_verify_lane_through_the_fused_kernel_agrees_with_its_piece_read(decode_ops, dtype):
    torch.manual_seed(3)
    c, kv_heads, heads, dim = 8, 2, 6, 32
    cache = torch.randn(2, kv_heads, 40 * c, dim, dtype=dtype)
    ws = [work(0, [1], 19, [3, 4, 9]), replace(work(1, [2, 3, 4, 5], 21, [1, 2, 5, 20]), drafts=LaneDrafts(num_drafts=3))]
    q = torch.randn(5, heads, dim, dtype=dtype)
    k_new, v_new = torch.randn(5, kv_heads, dim, dtype=dtype), torch.randn(5, kv_heads, dim, dtype=dtype)

    def run(kernel) -> torch.Tensor:
        inp = build_inputs(ws, ChunkCells(c, 40 * c), kernel)
        assert [w.lane for w in inp.work] == [0, 1]
        return attend(q, k_new, v_new, DenseCells(cache[0].clone()), DenseCells(cache[1].clone()), inp.meta)

    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(run(decode_ops.decode_attention).float(), run(None).float(), rtol=tol, atol=tol)

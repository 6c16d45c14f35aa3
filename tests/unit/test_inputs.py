"""The runner's batched inputs: exact cell addressing from chunk tables."""

from __future__ import annotations

import torch

from strata.engine.plan import LaneWork
from strata.runner.inputs import build_inputs


def work(lane, tokens, start, chunks, sample=True):
    return LaneWork(lane, f"r{lane}", tuple(tokens), start, tuple(chunks), sample)


def test_decode_rows_come_first_and_address_their_cells():
    c = 4
    ws = [
        work(0, [11, 12, 13], 0, [5, 2]),  # a prefill piece from position 0
        work(1, [21], 6, [0, 3]),  # a decode token at position 6: chunk 3, cell 2
        work(2, [31], 2, [7]),
    ]
    inp = build_inputs(ws, c)
    assert [w.lane for w in inp.work] == [1, 2, 0]
    assert inp.input_ids.tolist() == [21, 31, 11, 12, 13]
    assert inp.positions.tolist() == [6, 2, 0, 1, 2]
    assert inp.meta.write_index.tolist() == [3 * c + 2, 7 * c + 2, 5 * c, 5 * c + 1, 5 * c + 2]
    d = inp.meta.decode
    assert d.num_rows == 2 and d.max_cells == 7
    rows = d.cell_index.view(2, 7).tolist()
    assert rows[0] == [0, 1, 2, 3, 12, 13, 14]  # chunk 0 then chunk 3
    assert rows[1][:3] == [28, 29, 30]
    assert torch.isinf(d.bias[1, 0, 3:]).all() and (d.bias[1, 0, :3] == 0).all() and (d.bias[0] == 0).all()
    (p,) = inp.meta.prefills
    assert (p.row_start, p.row_end, p.num_cells) == (2, 5, 3)
    assert p.cell_slice == slice(20, 23) and p.mask is None  # one chunk, from position 0: plain causal
    assert inp.logits_rows.tolist() == [0, 1, 4]


def test_prefill_piece_after_cached_cells_gets_an_offset_causal_mask():
    c = 4
    inp = build_inputs([work(0, [1, 2, 3], 5, [9, 4, 6], sample=False)], c)  # chunks not contiguous
    (p,) = inp.meta.prefills
    assert p.cell_slice is None
    assert p.cell_index.tolist() == [36, 37, 38, 39, 16, 17, 18, 19]
    assert p.mask.tolist() == [[j <= 5 + i for j in range(8)] for i in range(3)]
    assert inp.logits_rows.tolist() == [] and inp.sample_work == ()


def test_contiguous_chunks_are_read_in_place():
    c = 4
    inp = build_inputs([work(0, [7], 9, [2, 3, 4])], c)  # a single decoding lane over chunks 2,3,4
    d = inp.meta.decode
    assert d.cell_slice == slice(8, 18) and d.cell_index is None and d.bias is None
    two = build_inputs([work(0, [7], 9, [2, 3, 4]), work(1, [8], 0, [0])], c)
    assert two.meta.decode.cell_slice is None  # several lanes: one batched gather

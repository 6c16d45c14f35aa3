"""The fused decode attention over int8 K/V (`--kv int8`), read in place with its scales.

Each cell's int8 values times its float16 scale, rounded to the compute dtype, are the values
`Int8Cells.read` gives torch's reads; the kernel over int8 cells must equal the same kernel over
those values stored in the compute dtype, bit for bit, for every instruction set this CPU has
(the AVX-512 BF16 variant reads stored bfloat16 by other sums, int8 as the AVX-512 variant does),
in one storage or two, whatever the spans.
"""

from __future__ import annotations

import pytest
import torch

from strata.cells.dense import DenseCells
from strata.cells.int8 import Int8Cells
from strata.models.cell_reads import DecodeSpans
from tests.conftest import FUSED_ONLY
from tests.unit.test_fused_ops import ROWS, close, ref_attention

CELLS = 4096


def int8_cells(x: torch.Tensor) -> Int8Cells:
    cells = Int8Cells.zeros(x.shape[0], x.shape[1], x.shape[2], x.device)
    cells.write(torch.arange(x.shape[1]), x)
    return cells


def spans_of(rows) -> tuple[torch.Tensor, torch.Tensor]:
    spans = torch.tensor([s for r in rows for s in r], dtype=torch.long)
    row_spans = torch.tensor([0, *torch.tensor([len(r) for r in rows]).cumsum(0).tolist()], dtype=torch.long)
    return spans, row_spans


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group,dim", [(3, 64), (1, 16), (5, 32), (8, 128)])
def test_int8_cells_read_as_their_dequantised_values(decode_path, decode_ops, dtype, group, dim):
    g = torch.Generator().manual_seed(group * dim + 7)
    kv_heads = 3
    # keys of mixed magnitudes per cell (scales from 1e-3 to 10), values around 1
    k8 = int8_cells(torch.randn(kv_heads, CELLS, dim, generator=g) * torch.logspace(-3, 1, CELLS).view(1, -1, 1))
    v8 = int8_cells(torch.randn(kv_heads, CELLS, dim, generator=g))
    k, v = DenseCells(k8.read(slice(None), dtype)), DenseCells(v8.read(slice(None), dtype))
    q = torch.randn(len(ROWS), kv_heads * group, dim, generator=g).to(dtype)
    spans, row_spans = spans_of(ROWS)
    outs = {}
    try:
        for isa in decode_ops.attention_isas():
            decode_ops.set_attention_isa(isa)
            read = DecodeSpans(0, len(ROWS), spans, row_spans, decode_ops.decode_attention)
            outs[isa] = read.attend(q, k8, v8), read.attend(q, k, v)
    finally:
        decode_ops.set_attention_isa("auto")
    for isa, (got, dense) in outs.items():
        if isa == "avx512_bf16" and dtype == torch.bfloat16:  # its bfloat16 cells: vdpbf16ps, other sums;
            dense = outs["avx512"][1]  # int8 cells: the AVX-512 variant's float32 work
        assert torch.equal(got, dense), isa
        for r, row in enumerate(ROWS):
            idx = torch.cat([torch.arange(a, a + n) for a, n in row])
            close(got[r], ref_attention(q[r], k.data[:, idx], v.data[:, idx]), dtype, 1e-5, 2e-2)


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
@pytest.mark.parametrize("split", [1, 777, 3500])
def test_int8_cells_in_two_storages_read_as_one(decode_path, decode_ops, split):
    """The ring's arena and staging in int8: storages and scales split at `split`."""
    g = torch.Generator().manual_seed(split)
    k8 = int8_cells(torch.randn(3, CELLS, 64, generator=g))
    v8 = int8_cells(torch.randn(3, CELLS, 64, generator=g))
    q = torch.randn(len(ROWS), 9, 64, generator=g).to(torch.bfloat16)
    rows = [[s for a, n in row for s in ([(a, split - a), (split, a + n - split)] if a < split < a + n else [(a, n)])]
            for row in ROWS]
    spans, row_spans = spans_of(rows)
    att = decode_ops.decode_attention
    one = att(q, k8.data, v8.data, spans, row_spans, 0.125, k_scales=[k8.scale], v_scales=[v8.scale])
    two = att(q, k8.data[:, :split], v8.data[:, :split], spans, row_spans, 0.125,
              k8.data[:, split:].clone(), v8.data[:, split:].clone(),
              k_scales=[k8.scale[:, :split], k8.scale[:, split:].clone()],
              v_scales=[v8.scale[:, :split], v8.scale[:, split:].clone()])
    assert torch.equal(one, two)


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
def test_int8_cells_need_their_scales(decode_path, decode_ops):
    k8 = int8_cells(torch.randn(1, 32, 16))
    q, spans, row_spans = torch.zeros(1, 1, 16), torch.tensor([[0, 8]]), torch.tensor([0, 1])
    att = decode_ops.decode_attention
    with pytest.raises(RuntimeError, match="int8 with k_scales"):
        att(q, k8.data, k8.data, spans, row_spans, 1.0)
    with pytest.raises(RuntimeError, match="float16"):
        att(q, k8.data, k8.data, spans, row_spans, 1.0, k_scales=[k8.scale.float()], v_scales=[k8.scale.float()])
    with pytest.raises(RuntimeError, match="one k and one v scale"):
        att(q, k8.data, k8.data, spans, row_spans, 1.0, k_scales=[k8.scale], v_scales=[])
    with pytest.raises(RuntimeError, match="int8 with k_scales"):  # float cells with scales
        att(q, torch.zeros(1, 32, 16), torch.zeros(1, 32, 16), spans, row_spans, 1.0,
            k_scales=[k8.scale], v_scales=[k8.scale])

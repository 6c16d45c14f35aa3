"""int8 K/V (`--kv int8`): quantise/dequantise against a reference written here, cell copies
carry the scales, and the pool's bytes per cell count them."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.cells.int8 import Int8Cells, dequantise, quantise
from strata.cells.storage import KVStorage, kv_bytes_per_cell
from strata.kv.table import CellCopy

CPU = torch.device("cpu")


def reference_round_trip(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row of x [..., dim], in float64: (q, scale, q * scale), the scale
    absmax / 127 rounded to float16 first (what is stored)."""
    out_q = torch.zeros(x.shape, dtype=torch.float64)
    out_s = torch.zeros(x.shape[:-1], dtype=torch.float64)
    rows = x.reshape(-1, x.shape[-1]).tolist()
    for i, row in enumerate(rows):
        absmax = max(abs(v) for v in row)
        scale = float(torch.tensor(absmax / 127, dtype=torch.float32).half())
        q = [0 if scale == 0 else max(-127, min(127, round(float(torch.tensor(v / scale, dtype=torch.float32)))))
             for v in row]
        out_q.view(-1, x.shape[-1])[i] = torch.tensor(q, dtype=torch.float64)
        out_s.view(-1)[i] = scale
    return out_q, out_s, out_q * out_s.unsqueeze(-1)


@settings(max_examples=40, deadline=None)
@given(heads=st.integers(1, 3), cells=st.integers(1, 9), dim=st.sampled_from([1, 4, 64]),
       magnitude=st.sampled_from([1e-4, 1.0, 30.0, 3000.0]), seed=st.integers(0, 2**16))
def test_round_trip_matches_the_reference(heads, cells, dim, magnitude, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(heads, cells, dim, generator=g) * magnitude
    x[:, 0] = 0  # an all-zero cell: scale 0, values 0
    q, scale = quantise(x)
    assert q.dtype == torch.int8 and scale.dtype == torch.float16 and scale.shape == (heads, cells)
    want_q, want_scale, want_x = reference_round_trip(x)
    assert torch.equal(q.double(), want_q)
    assert torch.equal(scale.double(), want_scale)
    got = dequantise(q, scale, torch.float32)
    assert torch.equal(got.double(), want_x)  # int8 x float16 is exact in float32
    # Within half a step of the original, plus 127 x the float16 scale's rounding: 2^-11 relative,
    # or 2^-25 absolute where the scale is subnormal (absmax under 127 x 2^-14 ~ 0.0078).
    step = want_scale.unsqueeze(-1)
    assert ((got.double() - x.double()).abs() <= step * (0.5 + 127 * 2**-11) + 127 * 2**-25 + 1e-12).all()


def test_write_read_and_strided_read_agree():
    g = torch.Generator().manual_seed(0)
    cells = Int8Cells.zeros(2, 12, 8, CPU)
    x = torch.randn(2, 12, 8, generator=g)
    cells.write(torch.arange(12), x)
    full = cells.read(slice(0, 12), torch.float32)
    torch.testing.assert_close(full, dequantise(*quantise(x), torch.float32), atol=0, rtol=0)
    gathered = cells.read(torch.tensor([5, 1, 7]), torch.float32)
    assert torch.equal(gathered, full[:, [5, 1, 7]])
    strided = cells.read_strided(1, 4, 3, 2, torch.float32)  # slots start at 1, 5, 9; two cells each
    for s in range(3):
        assert torch.equal(strided[s], full[:, 1 + 4 * s : 3 + 4 * s])


def test_cell_copies_carry_the_scales():
    storage = KVStorage(4, 3, 2, 8, "int8", [CPU, CPU])
    g = torch.Generator().manual_seed(1)
    for t in (*storage.k, *storage.v):
        t.write(torch.arange(12), torch.randn(2, 12, 8, generator=g) * 5)
    before = [(t.data.clone(), t.scale.clone()) for t in (*storage.k, *storage.v)]
    copied = storage.copy_cells([CellCopy(0, 2, 0, 3), CellCopy(1, 3, 1, 2)])
    assert copied == 5 * storage.bytes_per_cell
    for t, (data, scale) in zip((*storage.k, *storage.v), before):
        for src, dst in [(0, 6), (1, 7), (2, 8), (4, 10), (5, 11)]:
            assert torch.equal(t.data[:, dst], data[:, src]) and torch.equal(t.scale[:, dst], scale[:, src])
        assert torch.equal(t.data[:, 9], data[:, 9])  # not copied


def test_bytes_per_cell_count_the_scales():
    # SmolLM2-135M: 30 layers, 3 K/V heads of 64
    assert kv_bytes_per_cell("bf16", 30, 3, 64) == 23040  # 22.5 KiB
    assert kv_bytes_per_cell("int8", 30, 3, 64) == 30 * 2 * 3 * (64 + 2) == 11880  # 51.6 % of bf16
    storage = KVStorage(2, 4, 3, 64, "int8", [CPU, CPU])
    assert storage.bytes_per_cell == kv_bytes_per_cell("int8", 2, 3, 64)
    real = sum(t.numel() * t.element_size() for c in (*storage.k, *storage.v) for t in c.parts)
    assert real == storage.num_bytes

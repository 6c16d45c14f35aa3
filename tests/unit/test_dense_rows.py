"""models/rows.py's dense GEMM of a step's rows: bfloat16 steps of F32_GEMM_MIN_ROWS rows and
more run on float32 copies where the CPU has no bfloat16 dot products (decided per call), the
same values summed in float32 and rounded once; fewer rows, float32 inputs and CPUs with
AVX-512 BF16 or AMX keep torch's bfloat16 GEMM."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from strata.models.rows import F32_GEMM_MIN_ROWS, bf16_gemm_in_f32, dense_rows, linear


def _no_bf16_dots(monkeypatch, absent: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: not absent)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)


@pytest.mark.parametrize("absent", [True, False])
def test_the_route_is_chosen_by_rows_dtype_and_cpu(monkeypatch, absent):
    _no_bf16_dots(monkeypatch, absent)
    x = torch.zeros(F32_GEMM_MIN_ROWS, 8, dtype=torch.bfloat16)
    assert bf16_gemm_in_f32(x) is absent
    assert not bf16_gemm_in_f32(x[:-1]) and not bf16_gemm_in_f32(x.float())


def test_the_float32_route_sums_exact_products_in_float32(monkeypatch):
    _no_bf16_dots(monkeypatch, True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 96, generator=g).bfloat16()
    w, b = torch.randn(72, 96, generator=g).bfloat16(), torch.randn(72, generator=g).bfloat16()
    got = linear(x, w, b)
    assert got.dtype == torch.bfloat16
    want = F.linear(x.double(), w.double(), b.double())
    # one rounding to bfloat16 of a float32 sum of exact products: within a bf16 half-ulp or so
    torch.testing.assert_close(got.double(), want, rtol=2 ** -8, atol=1e-6)
    assert torch.equal(got, F.linear(x.float(), w.float(), b.float()).bfloat16())


def test_dense_rows_keeps_a_sampling_row_alone_on_the_float32_route(monkeypatch):
    """A row of `alone` is multiplied by itself (torch's bfloat16 GEMM at one row), the piece
    around it on the float32 route: the row equals its one-row product whatever the piece."""
    _no_bf16_dots(monkeypatch, True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(50, 64, generator=g).bfloat16()
    w = torch.randn(32, 64, generator=g).bfloat16()
    out = dense_rows(x[2:], w, None, alone=(47,))
    assert out.shape == (48, 32)
    assert torch.equal(out[-1], F.linear(x[49:], w)[0])
    assert torch.equal(out[:-1], F.linear(x[2:].float(), w.float()).bfloat16()[:-1])

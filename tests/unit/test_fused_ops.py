"""The fused CPU decode ops against the torch ops they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from strata.config import FUSED_ENV, fused_enabled
from strata.models.fused import load_decode_ops
from strata.models.layers import RMSNorm, Rotary, apply_rotary


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("rows", [1, 8, 300])
def test_rms_norm_and_add_rms_norm_match_torch(decode_ops, dtype, tol, rows):
    g = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 576, generator=g) * 3).to(dtype)
    d = torch.randn(rows, 576, generator=g).to(dtype)
    norm = RMSNorm(torch.randn(576, generator=g).to(dtype), 1e-5)
    want = F.rms_norm(x, (576,), norm.weight, 1e-5)
    torch.testing.assert_close(decode_ops.rms_norm(x, norm.weight, 1e-5), want, rtol=tol, atol=tol)
    want_x = x + d
    got_x, got = norm.add_and_norm(x.clone(), d, decode_ops)
    assert torch.equal(got_x, want_x)  # the residual sum rounds once, like torch's add
    torch.testing.assert_close(got, norm(want_x), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_rope_write_rotates_q_and_k_and_writes_k_and_v_to_their_cells(decode_ops, dtype, tol):
    g = torch.Generator().manual_seed(2)
    heads, kv_heads, dim, tokens = 6, 2, 16, 5
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    rotary = Rotary(rope_inv_freq_for(dim), 64, dtype, torch.device("cpu"))
    cos, sin = rotary.tables(torch.tensor([0, 7, 8, 30, 63]))
    cells = torch.tensor([3, 11, 12, 40, 0])
    k_cache, v_cache = torch.zeros(kv_heads, 48, dim, dtype=dtype), torch.zeros(kv_heads, 48, dim, dtype=dtype)
    q = decode_ops.rope_write(qkv, cos.squeeze(1), sin.squeeze(1), k_cache, v_cache, cells, heads, kv_heads)
    qk = apply_rotary(qkv[:, : (heads + kv_heads) * dim].view(tokens, -1, dim), cos, sin)
    torch.testing.assert_close(q, qk[:, :heads], rtol=tol, atol=tol)
    torch.testing.assert_close(k_cache[:, cells].transpose(0, 1), qk[:, heads:], rtol=tol, atol=tol)
    v = qkv[:, (heads + kv_heads) * dim :].view(tokens, kv_heads, dim)
    assert torch.equal(v_cache[:, cells].transpose(0, 1), v)
    untouched = torch.ones(48, dtype=torch.bool)
    untouched[cells] = False
    assert (k_cache[:, untouched] == 0).all() and (v_cache[:, untouched] == 0).all()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("group,dim", [(3, 64), (1, 16), (5, 32), (8, 128)])
def test_decode_attention_matches_sdpa_over_spans(decode_ops, dtype, tol, group, dim):
    """Rows over spans of one storage: one cell, one span, several out of order, a span of one
    cell, 1000 cells (many blocks of the kernel), a lane whose spans come in reverse storage order."""
    g = torch.Generator().manual_seed(group * dim)
    kv_heads, cells = 3, 4096
    k = torch.randn(kv_heads, cells, dim, generator=g).to(dtype)
    v = torch.randn(kv_heads, cells, dim, generator=g).to(dtype)
    rows = [[(0, 1)], [(10, 70)], [(100, 33), (2000, 1), (500, 64)], [(3000, 1000)], [(1200, 8), (1100, 8)],
            [(4000, 96)], [(129, 127), (7, 2)]]
    spans = torch.tensor([s for r in rows for s in r], dtype=torch.long)
    row_spans = torch.tensor([0, *torch.tensor([len(r) for r in rows]).cumsum(0).tolist()], dtype=torch.long)
    q = torch.randn(len(rows), kv_heads * group, dim, generator=g).to(dtype)
    got = decode_ops.decode_attention(q, k, v, spans, row_spans, dim**-0.5)
    for r, row in enumerate(rows):
        idx = torch.cat([torch.arange(a, a + n) for a, n in row])
        qg = q[r].float().view(1, kv_heads, group, dim)
        want = F.scaled_dot_product_attention(qg, k[:, idx].float().unsqueeze(0), v[:, idx].float().unsqueeze(0))
        torch.testing.assert_close(got[r].float(), want.view(kv_heads * group, dim), rtol=tol, atol=tol)


def test_decode_attention_reads_strided_queries_and_storage(decode_ops):
    """q as a view of q|k side by side (rows not contiguous), storage a strided view of a
    larger cache: the same result as from contiguous copies."""
    g = torch.Generator().manual_seed(1)
    qk = torch.randn(2, 9 + 3, 16, generator=g)
    big = torch.randn(2, 3, 64, 16, generator=g)
    spans, row_spans = torch.tensor([[0, 20], [30, 5]]), torch.tensor([0, 1, 2])
    got = decode_ops.decode_attention(qk[:, :9], big[0], big[1], spans, row_spans, 0.25)
    want = decode_ops.decode_attention(qk[:, :9].contiguous(), big[0].clone(), big[1].clone(), spans, row_spans, 0.25)
    assert torch.equal(got, want)


def test_decode_attention_refuses_spans_outside_storage(decode_ops):
    k = torch.zeros(1, 32, 16)
    with pytest.raises(RuntimeError, match="outside storage"):
        decode_ops.decode_attention(torch.zeros(1, 1, 16), k, k, torch.tensor([[20, 13]]), torch.tensor([0, 1]), 1.0)


@pytest.mark.parametrize("rows,width", [(1, 1536), (5, 100), (130, 96)])  # vector body and scalar tail
def test_silu_mul_matches_torch(decode_ops, rows, width):
    g = torch.Generator().manual_seed(rows)
    gate_up = torch.randn(rows, 2 * width, generator=g) * 6
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(decode_ops.silu_mul(gate_up), F.silu(gate) * up, rtol=2e-6, atol=1e-6)
    bf = gate_up.bfloat16()  # bfloat16: silu rounds, then the product rounds, as torch's two ops
    gate, up = bf.chunk(2, dim=-1)  # (exp differs by an ulp between kernels: a rounding may flip)
    torch.testing.assert_close(decode_ops.silu_mul(bf), F.silu(gate) * up, rtol=8e-3, atol=1e-6)


def rope_inv_freq_for(dim: int) -> torch.Tensor:
    return 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))


@pytest.mark.parametrize("value,on", [("", True), ("1", True), ("on", True), ("0", False), ("false", False),
                                      ("OFF", False)])
def test_the_environment_turns_the_fused_ops_off(monkeypatch, value, on):
    monkeypatch.setenv(FUSED_ENV, value)
    assert fused_enabled() is on
    if not on:
        assert load_decode_ops() is None


def test_a_bad_environment_value_is_an_error(monkeypatch):
    monkeypatch.setenv(FUSED_ENV, "maybe")
    with pytest.raises(ValueError, match="STRATA_FUSED"):
        fused_enabled()

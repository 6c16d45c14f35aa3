"""The model's decode ops on each decode path (tests/conftest.py's DECODE_PATHS: the fused CPU
ops of strata/csrc where the CPU has AVX2, torch's ops everywhere) against references
written here in float64: RMSNorm and the residual add before it, rotary embedding with the
K/V write, decode attention over runs of cells, and silu(gate) * up."""

from __future__ import annotations

import math

import pytest
import torch

from strata.cells.dense import DenseCells
from strata.config import ATTENTION_ISA_ENV, FUSED_ENV, fused_enabled
from strata.errors import ConfigError
from strata.models.cell_reads import DecodeRuns, DecodeSpans
from strata.models.fused import load_decode_ops
from strata.models.layers import RMSNorm, Rotary, apply_rotary, silu_mul
from tests.conftest import FUSED_ONLY


def ref_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def ref_rotary(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x [T, heads, dim] rotated: pairs (i, i + dim/2) as complex numbers times e^(i pos f_i)."""
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    angle = positions.double()[:, None, None] * inv_freq.double()
    z = z * torch.polar(torch.ones_like(angle), angle)
    return torch.cat((z.real, z.imag), dim=-1)


def ref_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [heads, dim] over k, v [kv_heads, cells, dim]: softmax(q k^T / sqrt(dim)) v."""
    heads, dim = q.shape
    group = heads // k.shape[0]
    kk = k.double().repeat_interleave(group, 0)  # [heads, cells, dim]
    vv = v.double().repeat_interleave(group, 0)
    scores = torch.einsum("hd,hcd->hc", q.double(), kk) / math.sqrt(dim)
    return torch.einsum("hc,hcd->hd", torch.softmax(scores, -1), vv)


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, f32: float, bf16: float) -> None:
    tol = f32 if dtype == torch.float32 else bf16
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 8, 300])  # 300: more rows than the fused norms take (torch's)
def test_rms_norm_and_the_residual_add_before_it(path_ops, dtype, rows):
    g = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 576, generator=g) * 3).to(dtype)
    d = torch.randn(rows, 576, generator=g).to(dtype)
    norm = RMSNorm(torch.randn(576, generator=g).to(dtype), 1e-5)
    close(norm(x, path_ops), ref_rms_norm(x, norm.weight, 1e-5), dtype, 1e-5, 2e-2)
    got_x, got = norm.add_and_norm(x.clone(), d, path_ops)
    assert torch.equal(got_x, (x.double() + d.double()).to(dtype))  # the sum rounds once, like torch's add
    close(got, ref_rms_norm(got_x, norm.weight, 1e-5), dtype, 1e-5, 2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_rotates_q_and_k_and_the_write_puts_k_and_v_in_their_cells(decode_path, path_ops, dtype):
    g = torch.Generator().manual_seed(2)
    heads, kv_heads, dim, tokens = 6, 2, 16, 5
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    positions = torch.tensor([0, 7, 8, 30, 63])
    cos, sin = Rotary(inv_freq, 64, dtype, torch.device("cpu")).tables(positions)
    cells = torch.tensor([3, 11, 12, 40, 0])
    k_cells, v_cells = (DenseCells.zeros(kv_heads, 48, dim, dtype, torch.device("cpu")) for _ in range(2))
    v = qkv[:, (heads + kv_heads) * dim :].view(tokens, kv_heads, dim)
    # a second copy at other cells (the ring's arena beside the pool): one rotation, stored
    # twice; token 1 is not stored in it (cell -1: written to another buffer)
    k_copy, v_copy = (DenseCells.zeros(kv_heads, 20, dim, dtype, torch.device("cpu")) for _ in range(2))
    copy_cells = torch.tensor([19, -1, 3, 7, 11])
    stored = copy_cells >= 0
    if decode_path == "fused":  # one pass: q returned, k and v written (models/llama.py)
        t = k_cells.write_targets(v_cells, cells, dtype)
        ([k_view], [v_view], [index]) = t.k, t.v, t.cells
        q = path_ops.rope_write(qkv, cos.squeeze(1), sin.squeeze(1), [k_view, k_copy.data], [v_view, v_copy.data],
                                [index, copy_cells], heads, kv_heads)
        assert torch.equal(k_copy.data[:, copy_cells[stored]], k_cells.data[:, cells[stored]])
        assert torch.equal(v_copy.data[:, copy_cells[stored]], v_cells.data[:, cells[stored]])
        others = torch.ones(20, dtype=torch.bool)
        others[copy_cells[stored]] = False
        assert (k_copy.data[:, others] == 0).all() and (v_copy.data[:, others] == 0).all()
    else:  # the layer's torch path: q and k rotated side by side, then attention.attend's writes
        qk = apply_rotary(qkv[:, : (heads + kv_heads) * dim].view(tokens, -1, dim), cos, sin)
        q = qk[:, :heads]
        k_cells.write(cells, qk[:, heads:].transpose(0, 1))
        v_cells.write(cells, v.transpose(0, 1))
    want = ref_rotary(qkv[:, : (heads + kv_heads) * dim].view(tokens, -1, dim), positions, inv_freq)
    close(q, want[:, :heads], dtype, 1e-5, 3e-2)
    close(k_cells.data[:, cells].transpose(0, 1), want[:, heads:], dtype, 1e-5, 3e-2)
    assert torch.equal(v_cells.data[:, cells].transpose(0, 1), v)
    untouched = torch.ones(48, dtype=torch.bool)
    untouched[cells] = False
    assert (k_cells.data[:, untouched] == 0).all() and (v_cells.data[:, untouched] == 0).all()


# Each row's cells: runs of storage (first cell, cells) in position order: one cell, one run,
# several out of order, 1000 cells (many blocks of the kernel), runs in reverse storage order.
ROWS = [[(0, 1)], [(10, 70)], [(100, 33), (2000, 1), (500, 64)], [(3000, 1000)], [(1200, 8), (1100, 8)],
        [(4000, 96)], [(129, 127), (7, 2)]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group,dim", [(3, 64), (1, 16), (5, 32), (8, 128)])
def test_decode_attention_over_runs_of_cells(decode_path, path_ops, dtype, group, dim):
    g = torch.Generator().manual_seed(group * dim)
    kv_heads = 3
    k = DenseCells(torch.randn(kv_heads, 4096, dim, generator=g).to(dtype))
    v = DenseCells(torch.randn(kv_heads, 4096, dim, generator=g).to(dtype))
    q = torch.randn(len(ROWS), kv_heads * group, dim, generator=g).to(dtype)
    if decode_path == "fused":  # every row at once, through the kernel (cell_reads.DecodeSpans)
        spans = torch.tensor([s for r in ROWS for s in r], dtype=torch.long)
        row_spans = torch.tensor([0, *torch.tensor([len(r) for r in ROWS]).cumsum(0).tolist()], dtype=torch.long)
        got = DecodeSpans(0, len(ROWS), spans, row_spans, path_ops.decode_attention).attend(q, k, v)
    else:  # torch's read of a lane in runs of storage, merged by log-sum-exp (cell_reads.DecodeRuns)
        got = torch.cat([DecodeRuns(r, tuple(slice(a, a + n) for a, n in row)).attend(q[r : r + 1], k, v)
                         for r, row in enumerate(ROWS)])
    for r, row in enumerate(ROWS):
        idx = torch.cat([torch.arange(a, a + n) for a, n in row])
        close(got[r], ref_attention(q[r], k.data[:, idx], v.data[:, idx]), dtype, 1e-5, 2e-2)


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
def test_decode_attention_reads_strided_queries_and_storage(decode_path, decode_ops):
    """The kernel alone: q as a view of q|k side by side (rows not contiguous), storage a
    strided view of a larger cache: the same result as from contiguous copies."""
    g = torch.Generator().manual_seed(1)
    qk = torch.randn(2, 9 + 3, 16, generator=g)
    big = torch.randn(2, 3, 64, 16, generator=g)
    spans, row_spans = torch.tensor([[0, 20], [30, 5]]), torch.tensor([0, 1, 2])
    got = decode_ops.decode_attention(qk[:, :9], big[0], big[1], spans, row_spans, 0.25)
    want = decode_ops.decode_attention(qk[:, :9].contiguous(), big[0].clone(), big[1].clone(), spans, row_spans, 0.25)
    assert torch.equal(got, want)


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("split", [1, 120, 777, 3500])
def test_decode_attention_reads_a_second_storage_past_the_first(decode_path, decode_ops, dtype, split):
    """k_more/v_more (the ring's staging beside its arena): flat cells past the first storage's
    are the second's; the result is bit-identical to one storage holding both, whatever the
    rows' spans (each in one storage) and the split."""
    g = torch.Generator().manual_seed(split)
    k = torch.randn(3, 4096, 64, generator=g).to(dtype)
    v = torch.randn(3, 4096, 64, generator=g).to(dtype)
    q = torch.randn(len(ROWS), 9, 64, generator=g).to(dtype)
    spans, lengths = [], []
    for row in ROWS:  # a span over the split becomes two, positions in order
        cut = [s for a, n in row for s in ([(a, split - a), (split, a + n - split)] if a < split < a + n else [(a, n)])]
        spans += cut
        lengths.append(len(cut))
    spans_t = torch.tensor(spans, dtype=torch.long)
    row_spans = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.long)
    one = decode_ops.decode_attention(q, k, v, spans_t, row_spans, 0.125)
    two = decode_ops.decode_attention(q, k[:, :split].clone(), v[:, :split].clone(), spans_t, row_spans, 0.125,
                                      k[:, split:].clone(), v[:, split:].clone())
    assert torch.equal(one, two)
    with pytest.raises(RuntimeError, match="crosses"):
        decode_ops.decode_attention(q[:1], k[:, :split].clone(), v[:, :split].clone(),
                                    torch.tensor([[split - 1, 2]]), torch.tensor([0, 1]), 0.125,
                                    k[:, split:].clone(), v[:, split:].clone())


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
def test_decode_attention_refuses_spans_outside_storage(decode_path, decode_ops):
    k = torch.zeros(1, 32, 16)
    with pytest.raises(RuntimeError, match="outside storage"):
        decode_ops.decode_attention(torch.zeros(1, 1, 16), k, k, torch.tensor([[20, 13]]), torch.tensor([0, 1]), 1.0)


@pytest.mark.parametrize("rows,width", [(1, 1536), (5, 100), (130, 96), (3, 104)])  # vector bodies, scalar tail
def test_silu_mul(path_ops, rows, width):
    g = torch.Generator().manual_seed(rows)
    gate_up = torch.randn(rows, 2 * width, generator=g) * 6
    gate, up = gate_up.double().chunk(2, dim=-1)
    want = gate * torch.sigmoid(gate) * up
    close(silu_mul(gate_up, path_ops), want, torch.float32, 2e-6, 0)
    bf = gate_up.bfloat16()  # bfloat16: silu rounds, then the product rounds (two bf16 roundings)
    gate, up = bf.double().chunk(2, dim=-1)
    close(silu_mul(bf, path_ops), gate * torch.sigmoid(gate) * up, torch.bfloat16, 0, 1.6e-2)


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_gives_a_value_the_same_in_every_lane(decode_path, decode_ops, dtype):
    """An activation's value does not depend on where in the row it is: 16-lane blocks (AVX-512,
    where the CPU has it) and the 8-lane rest (AVX2) compute the same. Width 24: a value moves
    between the two by rotating its row by 8."""
    ops = decode_ops
    g = torch.Generator().manual_seed(9)
    gate, up = (torch.randn(64, 24, generator=g) * 6).to(dtype), torch.randn(64, 24, generator=g).to(dtype)
    got = ops.silu_mul(torch.cat([gate, up], dim=1))
    rolled = ops.silu_mul(torch.cat([gate.roll(8, 1), up.roll(8, 1)], dim=1))
    assert torch.equal(rolled, got.roll(8, 1))


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


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group,dim", [(3, 64), (1, 16), (8, 128)])
def test_every_attention_instruction_set_this_cpu_has_matches_the_reference(decode_path, decode_ops, dtype, group,
                                                                            dim):
    """Each variant of the kernel's block work (strata/csrc/attention_*.cpp: AVX2, and AVX-512 and
    AVX-512 BF16 where cpuid has them), forced in turn, against the float64 reference; the
    variants agree (bfloat16 K/V: the BF16 variant's q.k sums are float32 sums of exact products)."""
    g = torch.Generator().manual_seed(group + dim)
    kv_heads = 3
    k = DenseCells(torch.randn(kv_heads, 4096, dim, generator=g).to(dtype))
    v = DenseCells(torch.randn(kv_heads, 4096, dim, generator=g).to(dtype))
    q = torch.randn(len(ROWS), kv_heads * group, dim, generator=g).to(dtype)
    spans = torch.tensor([s for r in ROWS for s in r], dtype=torch.long)
    row_spans = torch.tensor([0, *torch.tensor([len(r) for r in ROWS]).cumsum(0).tolist()], dtype=torch.long)
    isas = decode_ops.attention_isas()
    assert isas[0] == "avx2" and set(isas) <= {"avx2", "avx512", "avx512_bf16"}
    outs = {}
    try:
        for isa in isas:
            decode_ops.set_attention_isa(isa)
            assert decode_ops.attention_isa() == isa
            outs[isa] = DecodeSpans(0, len(ROWS), spans, row_spans, decode_ops.decode_attention).attend(q, k, v)
    finally:
        decode_ops.set_attention_isa("auto")
    for isa, got in outs.items():
        for r, row in enumerate(ROWS):
            idx = torch.cat([torch.arange(a, a + n) for a, n in row])
            close(got[r], ref_attention(q[r], k.data[:, idx], v.data[:, idx]), dtype, 1e-5, 2e-2)
    for got in outs.values():  # float32 accumulation both ways: only the summation order differs
        close(got, outs["avx2"].double(), dtype, 1e-5, 1e-2)


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
def test_the_environment_forces_the_attention_instruction_set(decode_path, decode_ops, monkeypatch):
    has_avx512 = "avx512" in decode_ops.attention_isas()  # cpuid's answer, as the kernel reads it
    try:
        monkeypatch.setenv(ATTENTION_ISA_ENV, "avx2")
        assert load_decode_ops(enabled=True).attention_isa() == "avx2"
        monkeypatch.setenv(ATTENTION_ISA_ENV, "auto")
        assert load_decode_ops(enabled=True).attention_isa() == decode_ops.attention_isas()[-1]  # the best
        monkeypatch.setenv(ATTENTION_ISA_ENV, "sse2")
        with pytest.raises(ConfigError, match=ATTENTION_ISA_ENV):
            load_decode_ops(enabled=True)
        if not has_avx512:  # a variant this CPU lacks is refused by name
            monkeypatch.setenv(ATTENTION_ISA_ENV, "avx512")
            with pytest.raises(ConfigError, match="this CPU runs only avx2"):
                load_decode_ops(enabled=True)
    finally:
        decode_ops.set_attention_isa("auto")

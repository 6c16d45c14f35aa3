"""strata/csrc/amx_attention.cpp: a prompt piece's causal attention on AMX tiles, read through
`PrefillSpans` (runner/inputs.py gives it every prompt piece the decode kernel does not read
where the CPU has AMX-BF16).

Against float64 attention over the same bfloat16 values (hypothesis: rows, cells, heads, K/V
heads, head dims 32-256, cells in runs anywhere in storage): within the weights' and the
output's bfloat16 roundings. Bit for bit, on one CPU: a row's output does not depend on the rows
beside it (the last rows of a piece alone give the piece's last rows), nor on where its cells
are stored. The choice by `$STRATA_PROMPT_ATTENTION`, and the op's refusals."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.cells.dense import DenseCells
from strata.config import PROMPT_ATTENTION_ENV
from strata.errors import ConfigError
from strata.models.cell_reads import PrefillSpans
from strata.models.fused import load_decode_ops
from strata.runner.inputs import SPANS_MAX_ROWS_BESIDE_PROMPT_KERNEL, build_inputs
from strata.runner.reads import ChunkCells
from strata.step import LaneWork

OPS = load_decode_ops(True)
needs_amx = pytest.mark.skipif(OPS is None or not hasattr(OPS, "prompt_attention") or not OPS.amx_available(),
                               reason="this CPU (or build) has no AMX-BF16")


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [rows, heads, dim], k/v [kv_heads, n, dim] (the piece's cells in position order) ->
    float64 [rows, heads, dim]: row r is position n - rows + r, causal."""
    rows, heads, dim = q.shape
    n = k.shape[1]
    group = heads // k.shape[0]
    seen = torch.arange(n) <= torch.arange(n - rows, n).unsqueeze(1)
    kk = k.double().repeat_interleave(group, 0)
    vv = v.double().repeat_interleave(group, 0)
    s = torch.einsum("rhd,hnd->hrn", q.double(), kk) * dim ** -0.5
    p = torch.softmax(s.masked_fill(~seen, float("-inf")), -1)
    return torch.einsum("hrn,hnd->rhd", p, vv)


def scattered(k: torch.Tensor, v: torch.Tensor, cuts: list[int], gap: int):
    """The cells of k/v [kv_heads, n, dim] stored in runs split at `cuts`, in reverse storage
    order with `gap` unused cells between them: (k storage, v storage, spans)."""
    n = k.shape[1]
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < n)), n]
    runs = list(zip(bounds[:-1], bounds[1:]))
    size = n + gap * (len(runs) + 1)
    ks = torch.randn(k.shape[0], size, k.shape[2]).bfloat16()  # unused cells: garbage never read
    vs = torch.randn(k.shape[0], size, k.shape[2]).bfloat16()
    spans, at = [], size
    for a, b in runs:  # the first run last in storage
        at -= gap + (b - a)
        ks[:, at : at + b - a], vs[:, at : at + b - a] = k[:, a:b], v[:, a:b]
        spans.append((at, b - a))
    return ks, vs, torch.tensor(spans, dtype=torch.long)


@needs_amx
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 80), extra=st.integers(0, 70), kv_heads=st.sampled_from([1, 2, 3]),
       group=st.sampled_from([1, 3, 4]), dim=st.sampled_from([32, 64, 128, 256]),
       cuts=st.lists(st.integers(1, 149), max_size=3), seed=st.integers(0, 2 ** 16))
def test_the_kernel_is_causal_attention_within_bfloat16_rounding(rows, extra, kv_heads, group, dim, cuts, seed):
    g = torch.Generator().manual_seed(seed)
    n = rows + extra
    q = (torch.randn(rows, kv_heads * group, dim, generator=g) * 2).bfloat16()
    k = torch.randn(kv_heads, n, dim, generator=g).bfloat16()
    v = torch.randn(kv_heads, n, dim, generator=g).bfloat16()
    ks, vs, spans = scattered(k, v, cuts, gap=5)
    got = OPS.prompt_attention(q, ks, vs, spans, dim ** -0.5)
    want = reference(q, k, v)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    # weights rounded to bfloat16 (relative 2^-9 each), the output once (2^-9 of its value)
    torch.testing.assert_close(got.double(), want, rtol=2 ** -7, atol=4e-3 * v.abs().max().item())


@needs_amx
def test_a_rows_output_is_its_own_whatever_rows_share_the_piece_or_where_cells_are():
    g = torch.Generator().manual_seed(7)
    rows, n, dim = 75, 140, 64
    q = torch.randn(rows, 6, dim, generator=g).bfloat16()
    k = torch.randn(2, n, dim, generator=g).bfloat16()
    v = torch.randn(2, n, dim, generator=g).bfloat16()
    whole = OPS.prompt_attention(q, k, v, torch.tensor([[0, n]]), dim ** -0.5)
    for last in (1, 5, 32, 33, 64):  # the piece's last rows alone: their blocks of 32 differ
        alone = OPS.prompt_attention(q[-last:], k, v, torch.tensor([[0, n]]), dim ** -0.5)
        assert torch.equal(alone, whole[-last:]), last
    ks, vs, spans = scattered(k, v, [17, 64, 100], gap=3)
    assert torch.equal(OPS.prompt_attention(q, ks, vs, spans, dim ** -0.5), whole)
    strided = OPS.prompt_attention(q.transpose(0, 1).contiguous().transpose(0, 1), k, v, torch.tensor([[0, n]]),
                                   dim ** -0.5)  # queries not row-major: the same values
    assert torch.equal(strided, whole)


@needs_amx
def test_the_op_refuses_what_it_cannot_read():
    q = torch.zeros(4, 2, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 16, 64, dtype=torch.bfloat16)
    span = torch.tensor([[0, 8]])
    with pytest.raises(RuntimeError, match="bfloat16"):
        OPS.prompt_attention(q.float(), k.float(), k.float(), span, 0.125)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        OPS.prompt_attention(q[..., :48], k[..., :48], k[..., :48], span, 0.125)
    with pytest.raises(RuntimeError, match="past the cache"):
        OPS.prompt_attention(q, k, k, torch.tensor([[10, 8]]), 0.125)
    with pytest.raises(RuntimeError, match="rows over"):
        OPS.prompt_attention(q, k, k, torch.tensor([[0, 3]]), 0.125)


@needs_amx
def test_a_prompt_piece_is_read_through_its_spans_and_attends_as_the_kernel_says():
    """build_inputs with the prompt kernel: a piece over chunks 3, 4, 9, 10 and 2 (runs [12, 20),
    [36, 44) and [8, 12)) reads those spans; its sampling row is still read alone (decode kernel); a piece
    of few rows stays on the decode kernel. Through `PrefillSpans` the rows attend as the kernel
    over the cells copied out in position order."""
    c = 4
    piece = LaneWork(0, "r0", tuple(range(40, 60)), 0, (3, 4, 9, 10, 2), True, prompt=True)
    inp = build_inputs([piece], ChunkCells(c, 64), OPS.decode_attention, max_row_cells=1,
                       prompt_kernel=OPS.prompt_attention)
    (p,) = inp.meta.prefills
    assert isinstance(p, PrefillSpans) and (p.row_start, p.row_end) == (0, 20)
    assert p.spans.tolist() == [[12, 8], [36, 8], [8, 4]]
    (s,) = inp.meta.samples
    assert (s.row_start, s.num_rows) == (19, 1)
    # with the prompt kernel, pieces of few rows stay on the decode kernel, whatever their cells
    few = LaneWork(0, "r0", tuple(range(SPANS_MAX_ROWS_BESIDE_PROMPT_KERNEL)), 28, tuple(range(10)), True, prompt=True)
    small = build_inputs([few], ChunkCells(c, 64), OPS.decode_attention, max_row_cells=1,
                         prompt_kernel=OPS.prompt_attention)
    assert small.meta.prefills == () and small.meta.samples == ()
    assert [(d.row_start, d.num_rows) for d in small.meta.decode] == [(0, SPANS_MAX_ROWS_BESIDE_PROMPT_KERNEL)]
    g = torch.Generator().manual_seed(2)
    k = DenseCells(torch.randn(1, 64, 64, generator=g).bfloat16())
    v = DenseCells(torch.randn(1, 64, 64, generator=g).bfloat16())
    q = torch.randn(20, 3, 64, generator=g).bfloat16()
    cells = torch.cat([torch.arange(12, 20), torch.arange(36, 44), torch.arange(8, 12)])
    want = OPS.prompt_attention(q, k.data[:, cells].contiguous(), v.data[:, cells].contiguous(),
                                torch.tensor([[0, 20]]), 0.125)
    assert torch.equal(p.attend(q, k, v), want)


def test_the_choice_by_variable(monkeypatch, gguf_path):
    from strata.config import EngineConfig
    from strata.engine.engine import Engine

    def kernel():
        e = Engine(EngineConfig(model=gguf_path, dtype="bfloat16", max_context=256, batch=1, spec="off"),
                   progress=False)
        return e._model.prompt_attention_kernel(e._kv.dtype)

    monkeypatch.setenv(PROMPT_ATTENTION_ENV, "sdpa")
    assert kernel() is None
    monkeypatch.setenv(PROMPT_ATTENTION_ENV, "flash")
    with pytest.raises(ConfigError, match=PROMPT_ATTENTION_ENV):
        kernel()
    has_amx = OPS is not None and hasattr(OPS, "prompt_attention") and OPS.amx_available()
    monkeypatch.setenv(PROMPT_ATTENTION_ENV, "amx")
    if has_amx:
        assert kernel() is not None
    else:
        with pytest.raises(ConfigError, match=PROMPT_ATTENTION_ENV):
            kernel()
    monkeypatch.setenv(PROMPT_ATTENTION_ENV, "auto")
    assert (kernel() is not None) == has_amx

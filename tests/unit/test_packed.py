"""models/packed.py: a dense projection weight held in oneDNN's blocked layout where the CPU
runs bfloat16 GEMMs natively. Its GEMM sums exact bfloat16 products in float32 and rounds
once, like torch's `mm` (the values are checked against float64, so a wrong layout fails);
it survives pickling (the prepared-model cache); `dense_rows` reads it with sampling rows
alone; a model's attention and MLP projections hold it, expert
storage (copied by the expert cache) never does; an engine's warm-up runs every dense shape at
every prompt piece length before serving."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.models.linear import fused_linear
from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.errors import ConfigError
from strata.models.packed import PackedWeight, amx_gemm, packs_weights, warm_packed
from strata.models.rows import dense_rows, linear

CPU = torch.device("cpu")
needs_packing = pytest.mark.skipif(not packs_weights(torch.bfloat16, CPU),
                                   reason="this CPU has no native bfloat16 GEMM (no AVX-512 BF16, no AMX)")
needs_amx = pytest.mark.skipif(not packs_weights(torch.bfloat16, CPU) or amx_gemm() is None,
                               reason="this CPU (or build) has no AMX-BF16 GEMM")


def _close_to_exact(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert got.dtype == torch.bfloat16
    # a float32 sum of exact products, rounded once (a bias added in float32 before the rounding)
    torch.testing.assert_close(got.double(), want, rtol=2 ** -7, atol=1e-3)


def test_only_bfloat16_cpu_weights_are_packed():
    assert not packs_weights(torch.float32, CPU)
    assert not packs_weights(torch.bfloat16, torch.device("meta"))


@needs_packing
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 130), out=st.sampled_from([8, 40, 96]), inp=st.sampled_from([16, 64, 200]),
       bias=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_the_packed_gemm_sums_exact_products(rows, out, inp, bias, seed):
    _packed_gemm_is_exact(rows, out, inp, bias, seed)


def _packed_gemm_is_exact(rows: int, out: int, inp: int, bias: bool, seed: int) -> PackedWeight:
    """Packs a random [out, inp] bf16 weight, checks its GEMM on `rows` random rows against
    float64 and its bytes, and returns it. bf16 throughout: the packed GEMMs are bf16 only; the
    check is a tolerance around the exact product, the same on every CPU."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, inp, generator=g).bfloat16()
    w = torch.randn(out, inp, generator=g).bfloat16()
    b = torch.randn(out, generator=g).bfloat16() if bias else None
    p = PackedWeight(w)
    assert p.shape == w.shape and p.numel() * p.element_size() == w.numel() * 2
    got = linear(x, p, b)
    assert got.shape == (rows, out)
    _close_to_exact(got, x, w, b)
    assert torch.equal(p.plain(), w)
    return p


@needs_packing
def test_a_packed_weight_pickles_as_its_plain_weight():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(48, 32, generator=g).bfloat16()
    p = PackedWeight(w)
    back = pickle.loads(pickle.dumps(p))
    assert torch.equal(back.plain(), w)
    x = torch.randn(5, 32, generator=g).bfloat16()
    assert torch.equal(back.mm(x), p.mm(x))


@needs_packing
def test_dense_rows_with_a_packed_weight_keeps_sampling_rows_alone():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(30, 64, generator=g).bfloat16()
    w, b = torch.randn(24, 64, generator=g).bfloat16(), torch.randn(24, generator=g).bfloat16()
    p = PackedWeight(w)
    got = dense_rows(x[3:], p, b, alone=(7, 26))  # the piece in one GEMM, then each sampling row
    assert got.shape == (27, 24)
    for r in (7, 26):  # each sampling row is its own one-row GEMM, whatever the piece around it
        assert torch.equal(got[r], p.mm(x[r + 3 : r + 4], b)[0])
    keep = [r for r in range(27) if r not in (7, 26)]
    assert torch.equal(got[keep], p.mm(x[3:], b)[keep])
    _close_to_exact(got, x[3:], w, b)

@needs_packing
def test_layer_projections_are_packed_and_expert_storage_is_not():
    g = torch.Generator().manual_seed(5)

    def weights():
        return {"a.weight": torch.randn(16, 32, generator=g).bfloat16(),
                "b.weight": torch.randn(8, 32, generator=g).bfloat16()}

    packed = fused_linear(weights(), ["a.weight", "b.weight"], None, "auto", torch.bfloat16, CPU, pack=True)
    plain = fused_linear(weights(), ["a.weight", "b.weight"], None, "auto", torch.bfloat16, CPU)
    assert isinstance(packed.weight, PackedWeight) and packed.weight.shape == (24, 32)
    assert isinstance(plain.weight, torch.Tensor)
    assert packed.num_bytes == plain.num_bytes
    f32 = fused_linear({"a.weight": torch.randn(16, 32, generator=g)}, ["a.weight"], None, "auto", torch.float32,
                       CPU, pack=True)
    assert isinstance(f32.weight, torch.Tensor)


@needs_packing
def test_warm_up_runs_every_dense_shape_at_every_piece_length(gguf_path, monkeypatch):
    monkeypatch.setenv("STRATA_DENSE_GEMM", "onednn")  # the AMX kernel makes no kernel per row count
    engine = Engine(EngineConfig(model=gguf_path, dtype="bfloat16", weights="auto", max_context=64, prefill_chunk=12,
                                 spec="off"), progress=False)
    shapes = {tuple(lin.weight.shape) for lin in engine._model.projections()}
    assert len(shapes) == 4  # q|k|v, o, gate|up, down
    seen = []
    mm = PackedWeight.mm

    def recorded(self, x, bias=None):
        seen.append((tuple(self.shape), x.shape[0]))
        return mm(self, x, bias)

    monkeypatch.setattr(PackedWeight, "mm", recorded)
    engine.warm_up()
    assert sorted(seen) == sorted((shape, rows) for shape in shapes for rows in range(1, 13))


@needs_amx
@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 130), out=st.sampled_from([32, 64, 96]), inp=st.sampled_from([32, 64, 576]),
       bias=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_the_amx_gemm_sums_exact_products_and_rounds_once(rows, out, inp, bias, seed):
    assert _packed_gemm_is_exact(rows, out, inp, bias, seed).amx is not None


@needs_amx
@settings(max_examples=20, deadline=None)
@given(rows=st.integers(2, 100), picks=st.lists(st.integers(0, 99), min_size=1, max_size=5), seed=st.integers(0, 2 ** 16))
def test_an_amx_row_is_the_same_whatever_rows_share_its_gemm(rows, picks, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 64, generator=g).bfloat16()
    w, b = torch.randn(96, 64, generator=g).bfloat16(), torch.randn(96, generator=g).bfloat16()
    p = PackedWeight(w)
    whole = p.mm(x, b)
    picked = sorted({r % rows for r in picks})
    assert torch.equal(p.mm(x[picked], b), whole[picked])  # a few rows alone, in a partial block of 32
    assert torch.equal(p.mm(x[picked[-1]:], b), whole[picked[-1]:])  # a block boundary elsewhere


@needs_amx
def test_the_dense_gemm_is_chosen_by_environment_and_shape(monkeypatch):
    w = torch.randn(64, 32).bfloat16()
    assert PackedWeight(w).amx is not None
    assert PackedWeight(w[:40]).amx is None  # 40 outputs: not whole blocks of 32, oneDNN's layout
    amx = PackedWeight(w)
    monkeypatch.setenv("STRATA_DENSE_GEMM", "onednn")
    oned = PackedWeight(w[:, :16])
    assert oned.amx is None and torch.equal(oned.plain(), w[:, :16])
    seen = []
    mm = PackedWeight.mm
    monkeypatch.setattr(PackedWeight, "mm", lambda self, x, b=None: seen.append((tuple(self.shape), len(x))) or mm(self, x, b))
    warm_packed([amx, oned], 2)
    assert seen == [((64, 16), 1), ((64, 16), 2)]  # oneDNN's kernels made; nothing to make for AMX
    monkeypatch.setenv("STRATA_DENSE_GEMM", "avx")
    with pytest.raises(ConfigError, match="STRATA_DENSE_GEMM"):
        PackedWeight(w)


@needs_packing
def test_asking_for_the_amx_gemm_where_it_cannot_run_is_an_error(monkeypatch):
    if amx_gemm() is not None:
        monkeypatch.setattr("strata.models.packed.load_quant_ops", lambda: None)  # as on a CPU without it
    monkeypatch.setenv("STRATA_DENSE_GEMM", "amx")
    with pytest.raises(ConfigError, match="STRATA_DENSE_GEMM=amx"):
        amx_gemm()
    monkeypatch.setenv("STRATA_DENSE_GEMM", "auto")
    assert amx_gemm() is None

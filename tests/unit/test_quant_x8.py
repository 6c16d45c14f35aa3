"""strata's x8 kernel (strata/csrc/quant_x8.inc, packed by strata/models/q4x8.py) against
gguf-py's dequantisation.

The packing moves the file's bytes: unpacking gives gguf-py's float32 weights bit for bit,
for Q4_0, Q4_1 and projections mixing them, with output counts that are not multiples of
8 (a padded last group). The kernel reads 8-bit or 15-bit activations per 32-value block,
so its bound is the int8 path's (tests/unit/test_quant_kernels.py's module docstring) with
d = max|x_b| / 127 or / 16256, checked against float64 x @ dequantize(w).T at 1 to 17 rows
(tiles of 8 rows on AVX-512 VNNI, 4 on AVX2, and their remainders) on every instruction set
this CPU runs. The instruction sets' integer sums are exact and their float work is the same
operations in the same order, so they agree bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from hypothesis import given
from hypothesis import strategies as st

from strata.models.q4x8 import X8Matmul, pack_x8, unpack_x8
from strata.models.quant import QuantWeight, quant_from_blocks
from tests.unit.test_quant_kernels import SETTINGS, bound, random_blocks

X8 = [QT.Q4_0, QT.Q4_1]
LEVELS = {8: 127, 15: 16256}  # act_bits -> the activation codes' largest magnitude


@pytest.fixture(scope="module")
def ops(quant_ops):
    yield quant_ops
    quant_ops.set_quant_isa("auto")


@st.composite
def projections(draw, types=tuple(X8)):
    """(parts [(qtype, raw)], k, rows, seed, x_scale): one to three parts of `types` (Q4_0/Q4_1)
    of one input size."""
    k = 32 * draw(st.integers(1, 7))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from([2.0 ** -12, 0.02, 0.5]))
    qtypes = draw(st.lists(st.sampled_from(types), min_size=1, max_size=3))
    parts = [(q, random_blocks(q, draw(st.integers(1, 29)), k, scale, rng)) for q in qtypes]
    return parts, k, draw(st.integers(1, 17)), seed, draw(st.sampled_from([1e-3, 1.0, 30.0]))


def weights(parts, k: int) -> list[QuantWeight]:
    return [quant_from_blocks(raw, q, (raw.shape[0], k)) for q, raw in parts]


def reference(parts) -> np.ndarray:
    return np.concatenate([dequantize(raw, q).reshape(raw.shape[0], -1) for q, raw in parts]).astype(np.float64)


@SETTINGS
@given(case=projections())
def test_packing_keeps_every_value(case):
    parts, k, _, _, _ = case
    packed = pack_x8(weights(parts, k))
    out = sum(raw.shape[0] for _, raw in parts)
    assert packed.shape == ((out + 7) // 8, k // 32 * 160)  # Q4_1's 20 bytes per value block and column
    assert np.array_equal(unpack_x8(packed, out).numpy(), reference(parts).astype(np.float32))


@pytest.mark.parametrize("act_bits", [8, 15])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_kernel_is_within_the_int8_bound(ops, dtype, act_bits):
    @SETTINGS
    @given(case=projections())
    def run(case):
        parts, k, rows, seed, x_scale = case
        rng = np.random.default_rng(seed + 1)
        x = torch.from_numpy(rng.standard_normal((rows, k)) * x_scale).to(dtype)
        x[0] = 0 if rows > 2 else x[0]  # a zero row (scale 0) and an outlier
        x[-1, rng.integers(0, k)] *= 50
        w = reference(parts)
        xd = x.double().numpy()
        expected = xd @ w.T
        tol = bound(xd, [(raw, q, reference([(q, raw)])) for q, raw in parts], True, dtype == torch.bfloat16,
                    expected, LEVELS[act_bits])
        for isa in ops.quant_isas():
            matmul = X8Matmul.from_parts(weights(parts, k), act_bits)
            ops.set_quant_isa(isa)  # after binding: binding loads the ops at $STRATA_QUANT_ISA's choice
            y = matmul(x)
            assert y.dtype == dtype and y.shape == (rows, w.shape[0])
            err = np.abs(y.double().numpy() - expected)
            worst = np.unravel_index(np.argmax(err / tol), err.shape)
            assert (err <= tol).all(), f"{isa} {dtype}: error {err[worst]:.3g} > bound {tol[worst]:.3g} at {worst}"

    run()


@pytest.mark.parametrize("act_bits", [8, 15])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_each_row_is_the_same_at_every_row_count_and_isa(ops, dtype, act_bits):
    """A row's output depends neither on the rows beside it (every tile remainder of 1 to 17
    rows) nor on the instruction set: every ISA's output equals the first's bit for bit."""
    rng = np.random.default_rng(7)
    parts = [(QT.Q4_1, random_blocks(QT.Q4_1, 40, 576, 0.02, rng)), (QT.Q4_0, random_blocks(QT.Q4_0, 9, 576, 0.02, rng))]
    x = torch.randn(17, 576, generator=torch.Generator().manual_seed(3)).to(dtype)
    first = None
    for isa in ops.quant_isas():
        matmul = X8Matmul.from_parts(weights(parts, 576), act_bits)
        ops.set_quant_isa(isa)
        full = matmul(x)
        first = full if first is None else first
        assert torch.equal(full, first), f"{isa} differs from {ops.quant_isas()[0]}"
        for rows in range(1, 17):
            assert torch.equal(matmul(x[:rows]), full[:rows]), f"{isa}: {rows} rows"


def test_fifteen_bit_activations_are_closer_than_eight(ops):
    """On the same weights and rows the 15-bit activations' error is a fraction of the 8-bit ones'."""
    rng = np.random.default_rng(11)
    parts = [(QT.Q4_1, random_blocks(QT.Q4_1, 64, 576, 0.02, rng))]
    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(5))
    expected = x.double().numpy() @ reference(parts).T
    err = {bits: np.abs(X8Matmul.from_parts(weights(parts, 576), bits)(x).double().numpy() - expected).mean()
           for bits in LEVELS}
    assert err[15] < err[8] / 30  # 128 times finer steps; float32 rounding is the rest


def test_bad_arguments_are_errors(ops):
    w = weights([(QT.Q4_0, random_blocks(QT.Q4_0, 8, 64, 0.01, np.random.default_rng(0)))], 64)
    packed = pack_x8(w)
    with pytest.raises(RuntimeError, match=r"x \[rows, 64\]"):
        ops.Quant4x8Linear(packed, 8, 64)(torch.zeros(1, 96))
    with pytest.raises(RuntimeError, match="need 2 groups of 8"):
        ops.Quant4x8Linear(packed, 9, 64)
    with pytest.raises(RuntimeError, match="groups of 480 bytes"):
        ops.Quant4x8Linear(packed, 8, 96)
    with pytest.raises(RuntimeError, match="act_bits 8 or 15"):
        ops.Quant4x8Linear(packed, 8, 64, 16)
    with pytest.raises(ValueError, match="act_bits one of"):
        X8Matmul(packed, 8, 64, 4)
    with pytest.raises(ValueError, match="Q4_0/Q4_1"):
        pack_x8([QuantWeight(w[0].raw, int(QT.Q8_0), 64)])

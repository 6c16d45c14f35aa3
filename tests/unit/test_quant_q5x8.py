"""The x8 kernel's 5-bit form (q5x8: Q5_0 weights alone, strata/models/q4x8.py pack_q5x8)
against gguf-py's dequantisation.

The packing moves the file's bytes (the low nibbles as the x8 form's, the fifth bits regrouped
per 4-value word): unpacking gives gguf-py's float32 weights bit for bit. The kernel computes
w = d u + c with u = q in [0, 31] and c = -16 d, so its float rounding is bounded against
|d u| + |16 d| (`q8x8_bound` with offset 16). The AVX2 variant's 16-bit pair sums reach
2 x 31 x 127 and are widened per chain of four: the integer sums stay exact, so every
instruction set agrees bit for bit, codes 0 and 31 against activations of +-127 included.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from hypothesis import given

from strata.models.q4x8 import X8Matmul, pack_q5x8, unpack_q5x8
from tests.unit.test_quant_kernels import SETTINGS, random_blocks
from tests.unit.test_quant_q8x8 import q8x8_bound
from tests.unit.test_quant_x8 import LEVELS, projections, reference, weights


@pytest.fixture(scope="module")
def ops(quant_ops):
    yield quant_ops
    quant_ops.set_quant_isa("auto")


def check_isas(ops, parts, k: int, x: torch.Tensor, act_bits: int) -> None:
    """Every instruction set gives the same bits, within the bound against float64."""
    w = reference(parts)
    xd = x.double().numpy()
    expected = xd @ w.T
    tol = q8x8_bound(xd, parts, w, LEVELS[act_bits], x.dtype == torch.bfloat16, expected, offset=16)
    first = None
    for isa in ops.quant_isas():
        matmul = X8Matmul.from_q5x8_parts(weights(parts, k), act_bits)
        ops.set_quant_isa(isa)
        y = matmul(x)
        assert y.dtype == x.dtype and y.shape == (x.shape[0], w.shape[0])
        first = y if first is None else first
        assert torch.equal(y, first), f"{isa} differs from {ops.quant_isas()[0]}"
        err = np.abs(y.double().numpy() - expected)
        worst = np.unravel_index(np.argmax(err / tol), err.shape)
        assert (err <= tol).all(), f"{isa} {x.dtype}: error {err[worst]:.3g} > bound {tol[worst]:.3g} at {worst}"


@SETTINGS
@given(case=projections((QT.Q5_0,)))
def test_packing_keeps_every_value(case):
    parts, k, _, _, _ = case
    packed = pack_q5x8(weights(parts, k))
    out = sum(raw.shape[0] for _, raw in parts)
    assert packed.shape == ((out + 7) // 8, k // 32 * 176)  # Q5_0's 22 bytes per block and column
    assert np.array_equal(unpack_q5x8(packed, out).numpy(), reference(parts).astype(np.float32))


@pytest.mark.parametrize("act_bits", [8, 15])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_kernel_is_within_its_bound_on_every_isa(ops, dtype, act_bits):
    @SETTINGS
    @given(case=projections((QT.Q5_0,)))
    def run(case):
        parts, k, rows, seed, x_scale = case
        rng = np.random.default_rng(seed + 1)
        x = torch.from_numpy(rng.standard_normal((rows, k)) * x_scale).to(dtype)
        x[0] = 0 if rows > 2 else x[0]  # a zero row (scale 0) and an outlier
        x[-1, rng.integers(0, k)] *= 50
        check_isas(ops, parts, k, x, act_bits)

    run()


@pytest.mark.parametrize("act_bits", [8, 15])
def test_each_row_is_the_same_at_every_row_count(ops, act_bits):
    rng = np.random.default_rng(9)
    parts = [(QT.Q5_0, random_blocks(QT.Q5_0, 40, 576, 0.02, rng)), (QT.Q5_0, random_blocks(QT.Q5_0, 9, 576, 0.02, rng))]
    x = torch.randn(17, 576, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    for isa in ops.quant_isas():
        matmul = X8Matmul.from_q5x8_parts(weights(parts, 576), act_bits)
        ops.set_quant_isa(isa)
        full = matmul(x)
        for rows in range(1, 17):
            assert torch.equal(matmul(x[:rows]), full[:rows]), f"{isa}: {rows} rows"


@pytest.mark.parametrize("act_bits", [8, 15])
def test_extreme_codes_and_activations_agree_across_isas(ops, act_bits):
    """Codes 31 and 0 (every fifth bit set or clear) against activation blocks whose codes are
    all +-127: the AVX2 variant's largest 16-bit chains, 4 x 2 x 31 x 127, and their negatives."""
    rng = np.random.default_rng(5)
    rows, k = 11, 256
    raw = random_blocks(QT.Q5_0, 24, k, 0.02, rng).reshape(24, k // 32, 22)
    ones = rng.random((24, k // 32)) < 0.5  # blocks of code 31 (qh and qs all ones), else mixed 31 and 0
    raw[..., 2:] = np.where(ones[..., None], 0xFF, rng.choice(np.array([0x00, 0xFF], np.uint8), size=raw[..., 2:].shape))
    raw[:8, :, 2:] = 0xFF  # a whole group of 31
    parts = [(QT.Q5_0, raw.reshape(24, -1))]
    signs = rng.choice([-1.0, 1.0], size=(rows, k))
    signs[0], signs[1] = -1.0, 1.0
    check_isas(ops, parts, k, torch.from_numpy(signs * 3.0).to(torch.bfloat16), act_bits)


def test_bad_arguments_are_errors(ops):
    raw = random_blocks(QT.Q5_0, 8, 64, 0.01, np.random.default_rng(0))
    packed = pack_q5x8(weights([(QT.Q5_0, raw)], 64))
    with pytest.raises(RuntimeError, match="groups of 352 bytes"):
        ops.Quant4x8Linear(packed[:, :-1].contiguous(), 8, 64, 15, 5)
    with pytest.raises(RuntimeError, match="groups of 544 bytes"):
        ops.Quant4x8Linear(packed, 8, 64, 15, 8)  # the q8x8 form's record size
    q8 = (QT.Q8_0, random_blocks(QT.Q8_0, 8, 64, 0.01, np.random.default_rng(1)))
    with pytest.raises(ValueError, match="Q5_0 parts"):
        pack_q5x8(weights([(QT.Q5_0, raw), q8], 64))

"""strata's x8 kernel (strata/csrc/quant_x8.inc, packed by strata/models/q4x8.py) against
gguf-py's dequantisation.

The packing moves the file's bytes: unpacking gives gguf-py's float32 weights bit for bit,
for Q4_0, Q4_1 and projections mixing them, with output counts that are not multiples of
8 (a padded last group). The kernel reads 8-bit activations per 32-value block, so its
bound is the int8 path's (tests/unit/test_quant_kernels.py's module docstring), checked
against float64 x @ dequantize(w).T at 1 to 16 rows on every instruction set this CPU runs.
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


@pytest.fixture(scope="module")
def ops(quant_ops):
    yield quant_ops
    quant_ops.set_quant_isa("auto")


@st.composite
def projections(draw):
    """(parts [(qtype, raw)], k, rows, seed, x_scale): one to three Q4_0/Q4_1 parts of one input size."""
    k = 32 * draw(st.integers(1, 7))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from([2.0 ** -12, 0.02, 0.5]))
    qtypes = draw(st.lists(st.sampled_from(X8), min_size=1, max_size=3))
    parts = [(q, random_blocks(q, draw(st.integers(1, 29)), k, scale, rng)) for q in qtypes]
    return parts, k, draw(st.integers(1, 16)), seed, draw(st.sampled_from([1e-3, 1.0, 30.0]))


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_kernel_is_within_the_int8_bound(ops, dtype):
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
                    expected)
        for isa in ops.quant_isas():
            matmul = X8Matmul.from_parts(weights(parts, k))
            ops.set_quant_isa(isa)  # after binding: binding loads the ops at $STRATA_QUANT_ISA's choice
            y = matmul(x)
            assert y.dtype == dtype and y.shape == (rows, w.shape[0])
            err = np.abs(y.double().numpy() - expected)
            worst = np.unravel_index(np.argmax(err / tol), err.shape)
            assert (err <= tol).all(), f"{isa} {dtype}: error {err[worst]:.3g} > bound {tol[worst]:.3g} at {worst}"

    run()


def test_each_row_is_the_same_at_every_row_count(ops):
    """A row's output does not depend on the rows beside it (tiles of 1 to 8 rows, and more)."""
    rng = np.random.default_rng(7)
    parts = [(QT.Q4_1, random_blocks(QT.Q4_1, 40, 576, 0.02, rng))]
    matmul = X8Matmul.from_parts(weights(parts, 576))
    x = torch.randn(13, 576, generator=torch.Generator().manual_seed(3)).bfloat16()
    full = matmul(x)
    for rows in (1, 2, 5, 8, 9):
        assert torch.equal(matmul(x[:rows]), full[:rows])


def test_bad_arguments_are_errors(ops):
    w = weights([(QT.Q4_0, random_blocks(QT.Q4_0, 8, 64, 0.01, np.random.default_rng(0)))], 64)
    packed = pack_x8(w)
    with pytest.raises(RuntimeError, match=r"x \[rows, 64\]"):
        ops.Quant4x8Linear(packed, 8, 64)(torch.zeros(1, 96))
    with pytest.raises(RuntimeError, match="need 2 groups of 8"):
        ops.Quant4x8Linear(packed, 9, 64)
    with pytest.raises(RuntimeError, match="groups of 480 bytes"):
        ops.Quant4x8Linear(packed, 8, 96)
    with pytest.raises(ValueError, match="Q4_0/Q4_1"):
        pack_x8([QuantWeight(w[0].raw, int(QT.Q8_0), 64)])

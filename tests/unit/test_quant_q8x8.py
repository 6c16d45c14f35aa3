"""The x8 kernel's 8-bit form (q8x8: Q8_0 and Q5_0 weights, strata/models/q4x8.py pack_q8x8)
and 5-bit form (q5x8: Q5_0 weights alone, pack_q5x8) against gguf-py's dequantisation, and
the LM head that reads the 8-bit one (models/head.py X8Head).

The packing keeps the file's values (signed codes plus 128, the scales as they are): unpacking
gives gguf-py's float32 weights bit for bit, for Q8_0, Q5_0 and projections mixing them, with
output counts that are not multiples of 8. The
kernel computes w = d u + c with u = code + 128 and c = -128 d, so its float rounding is
bounded against |d u| + |c| rather than |w| (`q8x8_bound`); the activation codes' rounding
is the x8 kernel's (tests/unit/test_quant_x8.py). The AVX2 variant sums w = code with q
sign-moved by w (maddubs(|w|, +-q): pairs of at most 2 x 128 x 127, no saturation) and adds
128 times the activations' integer block sum: its integer sums are still exact, so every
instruction set agrees bit for bit, extreme codes and activations included.

The q5x8 form moves the file's bytes (the low nibbles as the x8 form's, the fifth bits
regrouped per 4-value word) and computes w = d u + c with u = q in [0, 31] and c = -16 d: its
rounding is bounded against |d u| + |16 d|. The AVX2 variant's 16-bit chains of four `maddubs`
reach 4 x 2 x 31 x 127 and are widened per chain: exact, so again every instruction set agrees,
codes 0 and 31 against activations of +-127 included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from hypothesis import given

from strata.models.head import X8Head
from strata.models.q4x8 import X8Matmul, pack_q5x8, pack_q8x8, unpack_q5x8, unpack_q8x8
from strata.models.quant import QuantWeight
from strata.models.rows import RowKinds, linear
from tests.unit.test_quant_kernels import SETTINGS, random_blocks
from tests.unit.test_quant_x8 import LEVELS, projections, reference, weights


@pytest.fixture(scope="module")
def ops(quant_ops):
    yield quant_ops
    quant_ops.set_quant_isa("auto")


SIZES = {QT.Q8_0: 34, QT.Q5_0: 22}


@dataclass(frozen=True)
class Form:
    types: tuple  # the block types it packs
    pack: Callable
    unpack: Callable
    matmul: Callable  # X8Matmul's constructor from parts
    record: int  # bytes per block and group of 8 columns
    offset: int  # c = -offset d
    mixed: tuple  # (type, columns) parts of one projection for the row-count test


FORMS = {
    "q8x8": Form((QT.Q8_0, QT.Q5_0), pack_q8x8, unpack_q8x8, X8Matmul.from_q8x8_parts, 272, 128,
                 ((QT.Q5_0, 40), (QT.Q8_0, 9))),
    "q5x8": Form((QT.Q5_0,), pack_q5x8, unpack_q5x8, X8Matmul.from_q5x8_parts, 176, 16, ((QT.Q5_0, 40), (QT.Q5_0, 9))),
}


def q8x8_bound(x: np.ndarray, parts, w: np.ndarray, levels: int, bf16_out: bool, y: np.ndarray,
               offset: int = 128) -> np.ndarray:
    """[rows, out]: the activation codes' rounding (amax / (2 levels) per |w|) plus float32
    rounding over k / 32 blocks against the form's own terms, |d u| + |offset d| per value
    (c = -offset d: 128 for q8x8, 16 for q5x8)."""
    k = x.shape[1]
    d = np.concatenate([raw.reshape(raw.shape[0], -1, SIZES[q])[..., 0:2].copy().view(np.float16)[..., 0]
                        for q, raw in parts]).astype(np.float64)
    c = np.repeat(offset * d, 32, axis=1)  # [out, k]: c = -offset d, so d u = w + offset d
    magnitude = np.abs(w + c) + np.abs(c)
    amax = np.repeat(np.abs(x).reshape(x.shape[0], -1, 32).max(axis=2), 32, axis=1)
    tol = amax @ np.abs(w).T * (1 / (2 * levels) + 2.0 ** -22)
    tol += (k / 32 + 8) * 2.0 ** -24 * ((np.abs(x) + amax / levels) @ magnitude.T)
    if bf16_out:
        tol = tol * (1 + 2.0 ** -8) + 2.0 ** -8 * np.abs(y)
    return tol + 1e-30


def check_isas(ops, form: Form, parts, k: int, x: torch.Tensor, act_bits: int) -> None:
    """Every instruction set gives the same bits, within the bound against float64."""
    w = reference(parts)
    xd = x.double().numpy()
    expected = xd @ w.T
    tol = q8x8_bound(xd, parts, w, LEVELS[act_bits], x.dtype == torch.bfloat16, expected, form.offset)
    first = None
    for isa in ops.quant_isas():
        matmul = form.matmul(weights(parts, k), act_bits)
        ops.set_quant_isa(isa)
        y = matmul(x)
        assert y.dtype == x.dtype and y.shape == (x.shape[0], w.shape[0])
        first = y if first is None else first
        assert torch.equal(y, first), f"{isa} differs from {ops.quant_isas()[0]}"
        err = np.abs(y.double().numpy() - expected)
        worst = np.unravel_index(np.argmax(err / tol), err.shape)
        assert (err <= tol).all(), f"{isa} {x.dtype}: error {err[worst]:.3g} > bound {tol[worst]:.3g} at {worst}"


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
def test_packing_keeps_every_value(form):
    @SETTINGS
    @given(case=projections(form.types))
    def run(case):
        parts, k, _, _, _ = case
        packed = form.pack(weights(parts, k))
        out = sum(raw.shape[0] for _, raw in parts)
        assert packed.shape == ((out + 7) // 8, k // 32 * form.record)  # 8 columns' blocks a record
        assert np.array_equal(form.unpack(packed, out).numpy(), reference(parts).astype(np.float32))

    run()


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
@pytest.mark.parametrize("act_bits", [8, 15])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_the_kernel_is_within_its_bound_on_every_isa(ops, form, dtype, act_bits):
    @SETTINGS
    @given(case=projections(form.types))
    def run(case):
        parts, k, rows, seed, x_scale = case
        rng = np.random.default_rng(seed + 1)
        x = torch.from_numpy(rng.standard_normal((rows, k)) * x_scale).to(dtype)
        x[0] = 0 if rows > 2 else x[0]  # a zero row (scale 0) and an outlier
        x[-1, rng.integers(0, k)] *= 50
        check_isas(ops, form, parts, k, x, act_bits)

    run()


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
@pytest.mark.parametrize("act_bits", [8, 15])
def test_each_row_is_the_same_at_every_row_count_and_isa(ops, form, act_bits):
    rng = np.random.default_rng(9)
    parts = [(q, random_blocks(q, n, 576, 0.02, rng)) for q, n in form.mixed]
    x = torch.randn(17, 576, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    first = None
    for isa in ops.quant_isas():
        matmul = form.matmul(weights(parts, 576), act_bits)
        ops.set_quant_isa(isa)
        full = matmul(x)
        first = full if first is None else first
        assert torch.equal(full, first), f"{isa} differs from {ops.quant_isas()[0]}"
        for rows in range(1, 17):
            assert torch.equal(matmul(x[:rows]), full[:rows]), f"{isa}: {rows} rows"


@pytest.mark.parametrize("act_bits", [8, 15])
def test_extreme_codes_and_activations_agree_across_isas(ops, act_bits):
    """Codes -128, -127, 127 and 0 against activation blocks whose codes are all +-127 (their
    values share one magnitude): the largest pair sums the AVX2 variant forms, 2 x 128 x 127,
    and their negatives; every instruction set gives the same bits, within the bound."""
    rng = np.random.default_rng(5)
    rows, k = 11, 256
    raw = random_blocks(QT.Q8_0, 24, k, 0.02, rng).reshape(24, k // 32, 34)
    raw[..., 2:] = rng.choice(np.array([-128, -127, 127, 0], dtype=np.int8), size=raw[..., 2:].shape).view(np.uint8)
    raw[:8, :, 2:] = np.array(-128, dtype=np.int8).view(np.uint8)  # a whole group of -128
    raw = raw.reshape(24, -1)
    signs = rng.choice([-1.0, 1.0], size=(rows, k))
    signs[0] = -1.0
    signs[1] = np.where(raw[0].reshape(-1, 34)[:, 2:].view(np.int8).reshape(-1) < 0, -1.0, 1.0)  # w q > 0
    check_isas(ops, FORMS["q8x8"], [(QT.Q8_0, raw)], k, torch.from_numpy(signs * 3.0).to(torch.bfloat16), act_bits)


@pytest.mark.parametrize("act_bits", [8, 15])
def test_extreme_5_bit_codes_agree_across_isas(ops, act_bits):
    """Codes 31 and 0 (every fifth bit set or clear) against activation blocks whose codes are
    all +-127: the AVX2 variant's largest 16-bit chains, 4 x 2 x 31 x 127, and their negatives."""
    rng = np.random.default_rng(5)
    rows, k = 11, 256
    raw = random_blocks(QT.Q5_0, 24, k, 0.02, rng).reshape(24, k // 32, 22)
    ones = rng.random((24, k // 32)) < 0.5  # blocks of code 31 (qh and qs all ones), else mixed 31 and 0
    raw[..., 2:] = np.where(ones[..., None], 0xFF, rng.choice(np.array([0x00, 0xFF], np.uint8), size=raw[..., 2:].shape))
    raw[:8, :, 2:] = 0xFF  # a whole group of 31
    signs = rng.choice([-1.0, 1.0], size=(rows, k))
    signs[0], signs[1] = -1.0, 1.0
    check_isas(ops, FORMS["q5x8"], [(QT.Q5_0, raw.reshape(24, -1))], k, torch.from_numpy(signs * 3.0).to(torch.bfloat16),
               act_bits)


def test_the_head_reads_the_form_for_decode_rows_only(ops):
    """Decode rows (at most max_rows of them) go through the q8x8 form, prompt rows and longer
    steps through the dense weight: each row's logits are the ones its path gives alone."""
    raw = random_blocks(QT.Q8_0, 100, 64, 0.02, np.random.default_rng(2))
    dense = torch.from_numpy(dequantize(raw, QT.Q8_0).reshape(100, -1)).to(torch.bfloat16)
    head = X8Head(X8Matmul.from_q8x8_parts(weights([(QT.Q8_0, raw)], 64)), dense, max_rows=4)
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    small = head.x8(x)
    assert torch.equal(head(x[:4]), small[:4])  # all decode rows, within max_rows
    assert torch.equal(head(x), linear(x, dense))  # over max_rows: dense
    mixed = head(x, RowKinds(decode=3, decode_logits=3))
    assert torch.equal(mixed[:3], small[:3]) and torch.equal(mixed[3:], linear(x[3:], dense))
    assert not torch.equal(small[:3], linear(x[:3], dense))  # the two paths are told apart


def test_bad_arguments_are_errors(ops):
    raw = random_blocks(QT.Q8_0, 8, 64, 0.01, np.random.default_rng(0))
    packed = pack_q8x8(weights([(QT.Q8_0, raw)], 64))
    with pytest.raises(RuntimeError, match="weight_bits 4, 5 or 8"):
        ops.Quant4x8Linear(packed, 8, 64, 15, 6)
    with pytest.raises(RuntimeError, match="groups of 544 bytes"):
        ops.Quant4x8Linear(packed[:, :-1].contiguous(), 8, 64, 15, 8)
    with pytest.raises(RuntimeError, match="groups of 320 bytes"):
        ops.Quant4x8Linear(packed, 8, 64, 15)  # the 4-bit form's record size
    with pytest.raises(ValueError, match="Q8_0/Q5_0"):
        pack_q8x8([QuantWeight(torch.from_numpy(random_blocks(QT.Q4_0, 8, 64, 0.01, np.random.default_rng(1))),
                               int(QT.Q4_0), 64)])


def test_bad_q5x8_arguments_are_errors(ops):
    raw = random_blocks(QT.Q5_0, 8, 64, 0.01, np.random.default_rng(0))
    packed = pack_q5x8(weights([(QT.Q5_0, raw)], 64))
    with pytest.raises(RuntimeError, match="groups of 352 bytes"):
        ops.Quant4x8Linear(packed[:, :-1].contiguous(), 8, 64, 15, 5)
    with pytest.raises(RuntimeError, match="groups of 544 bytes"):
        ops.Quant4x8Linear(packed, 8, 64, 15, 8)  # the q8x8 form's record size
    q8 = (QT.Q8_0, random_blocks(QT.Q8_0, 8, 64, 0.01, np.random.default_rng(1)))
    with pytest.raises(ValueError, match="Q5_0 parts"):
        pack_q5x8(weights([(QT.Q5_0, raw), q8], 64))

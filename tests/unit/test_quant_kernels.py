"""strata's quantized-weight kernels (strata/csrc/quant_*.cpp) against gguf-py's own dequantisation.

For every type read in place, random valid blocks (hypothesis: odd shapes, 1 to 16
activation rows, one to three parts of mixed types in one call, float32 and bfloat16
activations) on every instruction set this CPU runs. The reference is float64:
x @ dequantize(w).T with gguf-py's dequantised weights.

The bounds, per output y = sum_i w_i x_i:
- dequantisation is exact: the kernels' float32 weights equal gguf-py's bit for bit;
- float path (float32 activations): only float32 accumulation, at most (k / 8 + 8) roundings
  of 2^-24 each over sum |w_i x_i|;
- int8 path: each activation is quantized per block as q = round(x / d), d = max|x_b| / 127,
  so |x_i - d q_i| <= max|x_b| / 254 (half a step; plus 2^-22 relative for the float32
  d and 1/d). That moves y by at most sum_i |w_i| max|x_b(i)| (1/254 + 2^-22). The integer
  dot products are exact; the float32 sums of the blocks' terms add at most (k / 32 + 8)
  roundings over the terms' magnitudes, sum_i (|w_i - o_i| + |o_i|) (|x_i| + max|x_b(i)| / 127),
  where o_i is block's offset (its value at code 0: -8 d for Q4_0, the min for Q4_1, ...);
- a bfloat16 output adds half a bfloat16 unit: at most 2^-8 |y| (8 significant bits).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.config import QUANT_ISA_ENV
from strata.errors import ConfigError
from strata.models.fused import load_quant_ops
from strata.models.quant import KERNEL_TYPES

# Bytes of each block that hold codes (zeroed, they give the block's offsets o_i).
CODE_BYTES = {QT.Q4_0: (2, 18), QT.Q4_1: (4, 20), QT.Q5_0: (2, 22), QT.Q5_1: (4, 24), QT.Q8_0: (2, 34),
              QT.Q4_K: (16, 144), QT.Q5_K: (16, 176), QT.Q6_K: (0, 192)}
# float16 fields (scales, mins) of each block, written deliberately: random bytes there can be inf/NaN.
F16_FIELDS = {QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,),
              QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,)}
TYPES = sorted(KERNEL_TYPES)


@pytest.fixture(scope="module")
def ops(quant_ops):
    """Required on an AVX2 CPU, not applicable on one without (tests/conftest.py); the
    instruction set back to auto after the module."""
    yield quant_ops
    quant_ops.set_quant_isa("auto")


def random_blocks(qtype: QT, rows: int, k: int, scale: float, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, bytes]: random codes and scales, float16 fields of magnitude ~scale, either sign."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, k // block, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        values = scale * rng.uniform(0.25, 1.0, size=raw.shape[:2]) * rng.choice([-1.0, 1.0], size=raw.shape[:2])
        raw[..., off:off + 2] = values.astype(np.float16)[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


def offsets(raw: np.ndarray, qtype: QT) -> np.ndarray:
    """The weights with every code 0: each value's offset o_i."""
    block, size = GGML_QUANT_SIZES[qtype]
    zeroed = raw.reshape(raw.shape[0], -1, size).copy()
    lo, hi = CODE_BYTES[qtype]
    zeroed[..., lo:hi] = 0
    return dequantize(zeroed.reshape(raw.shape[0], -1), qtype).astype(np.float64)


def bound(x: np.ndarray, parts: list[tuple[np.ndarray, QT, np.ndarray]], int8: bool, bf16_out: bool,
          y: np.ndarray, levels: int = 127) -> np.ndarray:
    """[rows, sum out] the tolerance of the module docstring; `levels`: the activation codes'
    largest magnitude, d = max|x_b| / levels (127: 8 bits; the x8 kernel's 15 bits: 16256)."""
    k = x.shape[1]
    cols = []
    for raw, qtype, w in parts:
        block = GGML_QUANT_SIZES[qtype][0]
        if not int8:
            tol = (k / 8 + 8) * 2.0 ** -24 * (np.abs(x) @ np.abs(w).T)
        else:
            amax = np.repeat(np.abs(x).reshape(x.shape[0], -1, block).max(axis=2), block, axis=1)  # [rows, k]
            o = offsets(raw, qtype)
            magnitude = np.abs(w - o) + np.abs(o)
            tol = amax @ np.abs(w).T * (1 / (2 * levels) + 2.0 ** -22)
            tol += (k / 32 + 8) * 2.0 ** -24 * ((np.abs(x) + amax / levels) @ magnitude.T)
        cols.append(tol)
    tol = np.concatenate(cols, axis=1)
    if bf16_out:  # rounding the float32 result, itself within tol of y
        tol = tol * (1 + 2.0 ** -8) + 2.0 ** -8 * np.abs(y)
    return tol + 1e-30


@st.composite
def cases(draw, qtypes: list[QT]):
    k_unit = 256 if any(GGML_QUANT_SIZES[q][0] == 256 for q in qtypes) else 32
    k = k_unit * draw(st.integers(1, 6 if k_unit == 32 else 3))
    outs = [draw(st.integers(1, 37)) for _ in qtypes]
    rows = draw(st.integers(1, 16))
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.sampled_from([2.0 ** -12, 2.0 ** -6, 0.02, 0.5]))
    x_scale = draw(st.sampled_from([1e-3, 1.0, 30.0]))
    return k, outs, rows, seed, scale, x_scale


def check(ops, qtypes: list[QT], case, dtype: torch.dtype, isa: str, int8: bool) -> None:
    k, outs, rows, seed, scale, x_scale = case
    rng = np.random.default_rng(seed)
    raws = [random_blocks(q, n, k, scale, rng) for q, n in zip(qtypes, outs)]
    ws = [dequantize(r, q).reshape(r.shape[0], k).astype(np.float64) for r, q in zip(raws, qtypes)]
    x = torch.from_numpy(rng.standard_normal((rows, k)) * x_scale).to(dtype)
    # odd activations: a zero row (d = 0) and one outlier per row
    x[0] = 0 if rows > 2 else x[0]
    x[-1, rng.integers(0, k)] *= 50
    ops.set_quant_isa(isa)
    y = ops.quant_matmul(x, [torch.from_numpy(r) for r in raws], [int(q) for q in qtypes], int8)
    assert y.dtype == dtype and y.shape == (rows, sum(outs))
    xd = x.double().numpy()
    expected = np.concatenate([xd @ w.T for w in ws], axis=1)
    got = y.double().numpy()
    tol = bound(xd, list(zip(raws, qtypes, ws)), int8, dtype == torch.bfloat16, expected)
    err = np.abs(got - expected)
    worst = np.unravel_index(np.argmax(err / tol), err.shape)
    assert (err <= tol).all(), (f"{[q.name for q in qtypes]} {isa} int8={int8} {dtype}: error {err[worst]:.3g} "
                                f"> bound {tol[worst]:.3g} at {worst}")


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("int8", [True, False], ids=["int8", "float"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_one_type_against_gguf(ops, qtype, dtype, int8):
    @SETTINGS
    @given(case=cases([qtype]))
    def run(case):
        for isa in ops.quant_isas():
            check(ops, [qtype], case, dtype, isa, int8)

    run()


@pytest.mark.parametrize("int8", [True, False], ids=["int8", "float"])
def test_mixed_parts_in_one_call(ops, int8):
    """A projection's parts side by side (q|k|v of a Q4_K_M file mixes Q4_K, Q6_K, ...)."""
    @SETTINGS
    @given(qtypes=st.lists(st.sampled_from(TYPES), min_size=2, max_size=3), data=st.data())
    def run(qtypes, data):
        case = data.draw(cases(qtypes))
        for isa in ops.quant_isas():
            check(ops, qtypes, case, torch.bfloat16, isa, int8)

    run()


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_dequantised_rows_are_gguf_bit_for_bit(ops, qtype):
    rng = np.random.default_rng(int(qtype))
    k = 512
    raw = random_blocks(qtype, 23, k, 0.03, rng)
    expected = torch.from_numpy(dequantize(raw, qtype).reshape(23, k))
    ids = torch.tensor([5, 0, 22, 5, 17])
    for isa in ops.quant_isas():
        ops.set_quant_isa(isa)
        got = ops.quant_dequant_rows(torch.from_numpy(raw), int(qtype), ids, torch.float32)
        assert torch.equal(got, expected[ids])
        assert torch.equal(ops.quant_dequant_rows(torch.from_numpy(raw), int(qtype), ids, torch.bfloat16),
                           expected[ids].bfloat16())


def test_bad_arguments_are_errors(ops):
    raw = torch.from_numpy(random_blocks(QT.Q4_0, 4, 64, 0.01, np.random.default_rng(0)))
    with pytest.raises(RuntimeError, match="need rows of 18 bytes of type 2, got 30"):
        ops.quant_matmul(torch.zeros(1, 64), [raw[:, :30].contiguous()], [int(QT.Q4_0)], True)
    with pytest.raises(RuntimeError, match=r"x \[rows, 64\]"):
        ops.quant_matmul(torch.zeros(1, 96), [raw], [int(QT.Q4_0)], True)
    with pytest.raises(RuntimeError, match="not read in place"):
        ops.quant_matmul(torch.zeros(1, 64), [raw], [int(QT.Q2_K)], True)
    with pytest.raises(RuntimeError, match="outside"):
        ops.quant_dequant_rows(raw, int(QT.Q4_0), torch.tensor([4]), torch.float32)


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def test_the_instruction_set_is_chosen_at_run_time(ops, monkeypatch):
    """cpuid picks AVX-512 VNNI where the CPU has it (as /proc/cpuinfo says), else AVX-VNNI,
    else AVX2; STRATA_QUANT_ISA forces one the CPU has."""
    flags = cpu_flags()
    has_vnni = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags
    has_avx_vnni = "avx_vnni" in flags
    assert ops.quant_isas() == ["avx2"] + ["avx_vnni"] * has_avx_vnni + ["avx512_vnni"] * has_vnni
    monkeypatch.setenv(QUANT_ISA_ENV, "avx2")
    assert load_quant_ops().quant_isa() == "avx2"
    monkeypatch.setenv(QUANT_ISA_ENV, "auto")
    assert load_quant_ops().quant_isa() == ("avx512_vnni" if has_vnni else "avx_vnni" if has_avx_vnni else "avx2")
    monkeypatch.setenv(QUANT_ISA_ENV, "sse2")
    with pytest.raises(ConfigError, match=QUANT_ISA_ENV):
        load_quant_ops()
    for isa, has in (("avx512_vnni", has_vnni), ("avx_vnni", has_avx_vnni)):
        monkeypatch.setenv(QUANT_ISA_ENV, isa)
        if has:
            assert load_quant_ops().quant_isa() == isa
        else:
            with pytest.raises(ConfigError, match="this CPU runs only avx2"):
                load_quant_ops()
    monkeypatch.setenv(QUANT_ISA_ENV, "auto")
    load_quant_ops()  # the process's own choice again, for the tests after this one

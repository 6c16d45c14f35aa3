"""The LM head: per-row int8 at decode steps of few rows, the dense weight otherwise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from strata.models.head import INT8_HEAD_MAX_ROWS, DenseHead, Int8Head, Int8Rows, make_head
from strata.models.rows import linear


def weight(vocab=300, hidden=64, dtype=torch.bfloat16) -> torch.Tensor:
    torch.manual_seed(0)
    w = torch.randn(vocab, hidden) * torch.linspace(0.01, 3, vocab).unsqueeze(1)  # rows of many scales
    w[7] = 0  # an all-zero row must not divide by zero
    return w.to(dtype)


def test_int8_rows_are_within_half_a_step_of_the_weight():
    w = weight()
    q = Int8Rows.quantize(w)
    assert q.codes.dtype == torch.int8 and q.codes.shape == w.shape and q.scale.shape == (w.shape[0],)
    assert (q.codes.abs().amax(1)[w.float().abs().amax(1) > 0] >= 126).all()  # each nonzero row uses the range
    err = (q.dequantize() - w.float()).abs()
    step = q.scale.float().unsqueeze(1)
    assert (err <= step / 2 + 1e-6).all()
    assert (q.dequantize()[7] == 0).all()
    chunked = Int8Rows.quantize(w, chunk=7)  # rows a chunk at a time: the same codes and scales
    assert torch.equal(chunked.codes, q.codes) and torch.equal(chunked.scale, q.scale)


@pytest.mark.parametrize("rows", [1, INT8_HEAD_MAX_ROWS])
def test_decode_steps_read_the_int8_copy(rows):
    w = weight()
    head = Int8Head(w)
    x = torch.randn(rows, w.shape[1]).to(torch.bfloat16)
    want = x.float() @ head.int8.dequantize().T  # what the int8 kernel computes, in float32
    got = head(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, w.shape[0])
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)  # bf16 output rounding
    assert not torch.equal(got, F.linear(x, w))  # it is not the dense product


def test_longer_steps_read_the_dense_weight_exactly():
    w = weight()
    x = torch.randn(INT8_HEAD_MAX_ROWS + 1, w.shape[1]).to(torch.bfloat16)
    assert torch.equal(Int8Head(w)(x), F.linear(x, w))


def test_which_head_each_build_gets():
    w = weight()
    cpu, bf16, f32 = torch.device("cpu"), torch.bfloat16, torch.float32
    assert isinstance(make_head(w, None, "auto", bf16, cpu), Int8Head)
    assert isinstance(make_head(w, None, "native", bf16, cpu), Int8Head)  # a float head in the file
    assert type(make_head(w, None, "dense", bf16, cpu)) is DenseHead
    assert type(make_head(w.float(), None, "auto", f32, cpu)) is DenseHead  # float32 compute stays exact


def test_a_quantized_head_is_read_in_place(quant_ops, monkeypatch):
    """native holds only the file's blocks; float32 auto reads them at decode steps (their exact
    values); bfloat16 auto reads a Q8_0 head's q8x8 form wherever strata's quantized kernels
    run, another type's blocks where torch's kernels run AVX2 only, else the int8 copy (or as
    $STRATA_HEAD_KERNEL says)."""
    import numpy as np
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import quantize

    from strata.config import HEAD_KERNEL_ENV
    from strata.errors import ConfigError
    from strata.models.head import (BF16_QUANT_HEAD_MAX_ROWS, QUANT_HEAD_MAX_ROWS, X8_HEAD_MAX_ROWS, QuantHead, X8Head,
                                    head_kernel, x8_head_max_rows)
    from strata.models.quant import QuantWeight

    dense = weight().float()
    q = QuantWeight(torch.from_numpy(quantize(dense.numpy(), QT.Q8_0)), int(QT.Q8_0), dense.shape[1])
    exact = q.dequantize()
    cpu = torch.device("cpu")
    native = make_head(None, q, "native", torch.float32, cpu)
    assert isinstance(native, QuantHead) and native.weight is None
    x = torch.randn(3, dense.shape[1], generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(native(x), x @ exact.T, rtol=1e-5, atol=1e-5)
    auto = make_head(exact, q, "auto", torch.float32, cpu)
    assert isinstance(auto, QuantHead) and auto.max_rows == QUANT_HEAD_MAX_ROWS
    big = torch.randn(QUANT_HEAD_MAX_ROWS + 1, dense.shape[1])
    assert torch.equal(auto(big), linear(big, exact))  # prompt rows: the dense weight, by models/rows.py's GEMM
    limits = {"int8": 4, "quant": BF16_QUANT_HEAD_MAX_ROWS, "x8": x8_head_max_rows()}
    for choice, kind in (("int8", Int8Head), ("quant", QuantHead), ("x8", X8Head)):  # $STRATA_HEAD_KERNEL forces one
        monkeypatch.setenv(HEAD_KERNEL_ENV, choice)
        head = make_head(exact.bfloat16(), q, "auto", torch.bfloat16, cpu)
        assert type(head) is kind and head.max_rows == limits[choice]
        assert head_kernel() == choice
    q4 = QuantWeight(torch.from_numpy(quantize(dense.numpy(), QT.Q4_0)), int(QT.Q4_0), dense.shape[1])
    assert type(make_head(exact.bfloat16(), q4, "auto", torch.bfloat16, cpu)) is Int8Head  # x8: Q8_0 heads only
    monkeypatch.delenv(HEAD_KERNEL_ENV)  # auto: q8x8 wherever strata's quantized kernels run, AVX2 or VNNI
    assert head_kernel() == "x8"
    avx2_torch = torch.backends.cpu.get_cpu_capability() == "AVX2"
    head = make_head(exact.bfloat16(), q, "auto", torch.bfloat16, cpu)
    assert type(head) is X8Head and head.max_rows == (BF16_QUANT_HEAD_MAX_ROWS if avx2_torch else X8_HEAD_MAX_ROWS)
    other = make_head(exact.bfloat16(), q4, "auto", torch.bfloat16, cpu)  # a head q8x8 cannot hold
    assert type(other) is (QuantHead if avx2_torch else Int8Head)
    monkeypatch.setenv(HEAD_KERNEL_ENV, "fast")
    with pytest.raises(ConfigError, match=HEAD_KERNEL_ENV):
        head_kernel()
    assert np.isfinite(native(x).numpy()).all()

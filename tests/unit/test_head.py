"""The LM head: per-row int8 at decode steps of few rows, the dense weight otherwise."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from strata.models.head import INT8_HEAD_MAX_ROWS, DenseHead, Int8Head, Int8Rows, make_head


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
    assert isinstance(make_head(w, "auto"), Int8Head)
    assert isinstance(make_head(w, "native"), Int8Head)
    assert type(make_head(w, "dense")) is DenseHead
    assert type(make_head(w.float(), "auto")) is DenseHead  # float32 compute stays exact

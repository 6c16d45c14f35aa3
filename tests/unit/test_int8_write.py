"""int8 K/V written in place by the fused rope-write (`Int8Cells.write_targets`,
strata/csrc/kv_int8.h): each new row is quantised as `Int8Cells.write` quantises it, code for
code and scale for scale, whatever the values (zero rows, scales that round or go subnormal in
float16, exact ties), into every copy it goes to (the ring's pool copy beside its arena or
staging), with q the same as a write to cells in the compute dtype."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.cells.dense import DenseCells
from strata.cells.int8 import Int8Cells
from strata.cells.protocol import WriteTargets
from strata.models.layers import Rotary
from tests.conftest import FUSED_ONLY

HEADS, KV_HEADS, DIM, CELLS = 6, 2, 16, 48
CPU = torch.device("cpu")
pytestmark = pytest.mark.parametrize("decode_path", FUSED_ONLY)


def tables(tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, DIM, 2).float() / DIM))
    cos, sin = Rotary(inv_freq, 64, dtype, CPU).tables(torch.arange(tokens) * 5)
    return cos.squeeze(1), sin.squeeze(1)


def rope_write(ops, qkv: torch.Tensor, t: WriteTargets) -> torch.Tensor:
    cos, sin = tables(qkv.shape[0], qkv.dtype)
    return ops.rope_write(qkv, cos, sin, t.k, t.v, t.cells, HEADS, KV_HEADS, k_scales=t.k_scales,
                          v_scales=t.v_scales)


def assert_same_cells(got: Int8Cells, want: Int8Cells) -> None:
    assert torch.equal(got.data, want.data)
    assert torch.equal(got.scale.view(torch.int16), want.scale.view(torch.int16))  # bit for bit


def check(ops, qkv: torch.Tensor, cells: torch.Tensor) -> None:
    """rope_write into int8 cells equals rope_write into cells of qkv's dtype, then `write`."""
    dtype = qkv.dtype
    k8, v8 = (Int8Cells.zeros(KV_HEADS, CELLS, DIM, CPU) for _ in range(2))
    kd, vd = (DenseCells.zeros(KV_HEADS, CELLS, DIM, dtype, CPU) for _ in range(2))
    q8 = rope_write(ops, qkv, k8.write_targets(v8, cells, dtype))
    q = rope_write(ops, qkv, kd.write_targets(vd, cells, dtype))
    assert torch.equal(q8, q)
    for got, dense in ((k8, kd), (v8, vd)):
        want = Int8Cells.zeros(KV_HEADS, CELLS, DIM, CPU)
        want.write(cells, dense.data[:, cells])
        assert_same_cells(got, want)


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 6), exponent=st.integers(-40, 12), zero_token=st.booleans(),
       bf16=st.booleans(), seed=st.integers(0, 2**16))
def test_rows_are_quantised_as_int8_cells_write_them(decode_path, decode_ops, tokens, exponent, zero_token, bf16,
                                                     seed):
    g = torch.Generator().manual_seed(seed)
    # magnitudes from 2^-40 (a scale of 0 or subnormal in float16) to 2^12, per token
    spread = torch.logspace(exponent - 4, exponent, tokens, base=2.0).view(-1, 1)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * DIM, generator=g) * spread
    if zero_token:
        qkv[0] = 0
    qkv = qkv.to(torch.bfloat16 if bf16 else torch.float32)
    cells = torch.randperm(CELLS, generator=g)[:tokens]
    check(decode_ops, qkv, cells)


def test_ties_round_to_even_as_torch_round(decode_path, decode_ops):
    """A V row whose largest value is 127 has scale 1: x / 1 = k + 1/2 rounds to the even k."""
    qkv = torch.zeros(1, (HEADS + 2 * KV_HEADS) * DIM)
    row = torch.tensor([127.0, 2.5, -3.5, 0.5, -0.5, 1.5, -126.5, 126.5] + [0.25] * (DIM - 8))
    qkv[0, (HEADS + KV_HEADS) * DIM:] = row.repeat(KV_HEADS)
    check(decode_ops, qkv, torch.tensor([3]))
    k8, v8 = (Int8Cells.zeros(KV_HEADS, CELLS, DIM, CPU) for _ in range(2))
    rope_write(decode_ops, qkv, k8.write_targets(v8, torch.tensor([3]), torch.float32))
    assert v8.data[0, 3, :8].tolist() == [127, 2, -4, 0, 0, 2, -126, 126] and v8.scale[0, 3].item() == 1.0


def test_every_copy_gets_the_same_codes_and_only_its_cells(decode_path, decode_ops):
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(4, (HEADS + 2 * KV_HEADS) * DIM, generator=g).to(torch.bfloat16)
    pool_k, pool_v = (Int8Cells.zeros(KV_HEADS, CELLS, DIM, CPU) for _ in range(2))
    ring_k, ring_v = (Int8Cells.zeros(KV_HEADS, 8, DIM, CPU) for _ in range(2))
    cells, ring_cells = torch.tensor([9, 10, 30, 31]), torch.tensor([7, -1, 0, 2])  # token 1 not in the ring
    targets = WriteTargets.joined([pool_k.write_targets(pool_v, cells, torch.bfloat16),
                                   ring_k.write_targets(ring_v, ring_cells, torch.bfloat16)])
    rope_write(decode_ops, qkv, targets)
    stored = ring_cells >= 0
    for pool, ring in ((pool_k, ring_k), (pool_v, ring_v)):
        assert torch.equal(ring.data[:, ring_cells[stored]], pool.data[:, cells[stored]])
        assert torch.equal(ring.scale[:, ring_cells[stored]], pool.scale[:, cells[stored]])
        others = torch.ones(8, dtype=torch.bool)
        others[ring_cells[stored]] = False
        assert (ring.data[:, others] == 0).all() and (ring.scale[:, others] == 0).all()
        assert (pool.scale[:, cells] > 0).all()


def test_scales_of_another_dtype_are_refused_by_name(decode_path, decode_ops):
    qkv = torch.randn(1, (HEADS + 2 * KV_HEADS) * DIM)
    k8, v8 = (Int8Cells.zeros(KV_HEADS, CELLS, DIM, CPU) for _ in range(2))
    t = k8.write_targets(v8, torch.tensor([0]), torch.float32)
    bad = WriteTargets(t.k, t.v, t.cells, [s.float() for s in t.k_scales], t.v_scales)
    with pytest.raises(RuntimeError, match="float16 scales"):
        rope_write(decode_ops, qkv, bad)
    with pytest.raises(RuntimeError, match="one scale per destination"):
        rope_write(decode_ops, qkv, WriteTargets(t.k, t.v, t.cells, t.k_scales, []))

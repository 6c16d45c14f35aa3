"""An expert slot (models/experts.py) computes exactly what the expert copied into it computes,
across refills, for dense and in-place quantized projections."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

from strata.models.linear import Linear
from strata.models.quant import QuantMatmul, quant_from_blocks
from strata.models.expert_bank import ResidentBank
from strata.models.experts import ExpertWeights


def dense_expert(gen: torch.Generator, hidden: int, width: int) -> ExpertWeights:
    return ExpertWeights(Linear(torch.randn(2 * width, hidden, generator=gen)),
                         Linear(torch.randn(hidden, width, generator=gen)))


def quant_expert(rng: np.random.Generator, hidden: int, width: int) -> ExpertWeights:
    def q(out: int, inp: int, qtype: QT):
        w = rng.standard_normal((out, inp)).astype(np.float32)
        return quant_from_blocks(quantize(w, qtype), qtype, (out, inp))
    gate, up = q(width, hidden, QT.Q8_0), q(width, hidden, QT.Q4_0)
    return ExpertWeights(Linear(None, None, QuantMatmul([gate, up])),
                         Linear(None, None, QuantMatmul([q(hidden, width, QT.Q8_0)])))


def test_dense_slot_follows_its_copies():
    gen = torch.Generator().manual_seed(0)
    a, b = dense_expert(gen, 16, 24), dense_expert(gen, 16, 24)
    x = torch.randn(5, 16, generator=gen)
    slot = a.empty_like("cpu")
    assert [t.shape for t in slot.tensors()] == [t.shape for t in a.tensors()]
    assert slot.num_bytes == a.num_bytes == (2 * 24 * 16 + 16 * 24) * 4
    slot.copy_from(a)
    assert torch.equal(slot(x), a(x))
    slot.copy_from(b)  # a refill: the same slot now computes b
    assert torch.equal(slot(x), b(x)) and not torch.equal(slot(x), a(x))


def test_quant_slot_follows_its_copies(quant_ops):
    rng = np.random.default_rng(1)
    a, b = quant_expert(rng, 64, 32), quant_expert(rng, 64, 32)
    x = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32))
    slot = a.empty_like("cpu")
    slot.copy_from(a)
    assert torch.equal(slot(x), a(x))
    slot.copy_from(b)  # the kernel bound to the slot's bytes reads the new expert
    assert torch.equal(slot(x), b(x)) and not torch.equal(slot(x), a(x))
    assert torch.equal(slot(x.bfloat16()), b(x.bfloat16()))


def test_copy_refuses_another_layout():
    gen = torch.Generator().manual_seed(2)
    a, c = dense_expert(gen, 16, 24), dense_expert(gen, 16, 8)
    with pytest.raises(AssertionError):
        a.empty_like("cpu").copy_from(c)


def test_resident_bank_runs_each_layers_experts():
    gen = torch.Generator().manual_seed(3)
    experts = [[], [dense_expert(gen, 8, 4) for _ in range(3)]]
    bank = ResidentBank(experts)
    x = torch.randn(2, 8, generator=gen)
    bank.plan(1, [2, 0])
    assert torch.equal(bank.run(1, 2, x), experts[1][2](x))

"""`--weights auto` on tiny Q4_0 and Q4_1 files: which projections read the x8 kernel, and what it changes.

By default bfloat16 decode rows read every projection's x8 form (models/q4x8.py, 15-bit
activations; $STRATA_Q4_KERNEL=x8-int8: 8-bit, =int4: torch's int4 form instead) beside the
dense copy; float32 never reads it, so float32
greedy tokens stay the dense model's. bfloat16 paths are compared with each other and with
dense float32 (within tolerance), never with fixed text.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from strata.config import Q4_KERNEL_ENV
from strata.models.rows import rows_alike
from strata.testing import prompt_logits
from tests.model.test_gguf_native import PROMPT, engine, fields, greedy, tiny_file  # noqa: F401 (fixture)

X8 = [QT.Q4_0, QT.Q4_1]


def projections(e):
    for layer in e._model.layers:
        yield from (layer.qkv, layer.o, layer.gate_up, layer.down)


@pytest.fixture(scope="module", params=X8, ids=[t.name for t in X8])
def x8_file(request, tmp_path_factory, fields) -> str:  # noqa: F811 (the imported fixture)
    return tiny_file(tmp_path_factory.mktemp(request.param.name), request.param, fields, tied=False)


def test_bfloat16_decode_rows_read_the_x8_form_and_stay_close(x8_file, quant_ops, monkeypatch):
    dense = engine(x8_file, "dense")
    auto = engine(x8_file, "auto", "bfloat16")  # the default: the x8 form, 15-bit activations
    assert all(p.x8 is not None and p.x8.act_bits == 15 and p.int4 is None and p.weight is not None
               for p in projections(auto))
    assert auto._model.weight_forms["x8"] == 8
    monkeypatch.setenv(Q4_KERNEL_ENV, "int4")
    old = engine(x8_file, "auto", "bfloat16")  # the opt-out: torch's int4 form
    assert all(p.int4 is not None and p.x8 is None for p in projections(old))
    monkeypatch.setenv(Q4_KERNEL_ENV, "x8-int8")
    coarse = engine(x8_file, "auto", "bfloat16")
    assert all(p.x8 is not None and p.x8.act_bits == 8 for p in projections(coarse))
    ids = dense.tokenizer.encode(PROMPT)
    expected = prompt_logits(dense, ids, as_decode=True)
    scale = expected.abs().max().item()
    got = prompt_logits(auto, ids, as_decode=True)
    before = prompt_logits(old, ids, as_decode=True)
    eight = prompt_logits(coarse, ids, as_decode=True)
    for other in (got, before, eight):  # 4-bit weights, bf16 elsewhere; activations 15 bits, bf16, 8 bits
        assert (other - expected).abs().max().item() <= 0.05 * scale
    assert not torch.equal(got, before) and not torch.equal(got, eight)  # a different kernel ran
    # prompt rows still read the dense copy: the x8 form changes no prompt logits but the
    # sampling row's (the last), which reads the 4-bit form as decode rows do (models/rows.py),
    # except where the dense GEMM's rows are alike at any row count (AMX): it reads dense there
    x8_rows, int4_rows = prompt_logits(auto, ids), prompt_logits(old, ids)
    assert torch.equal(x8_rows[:-1], int4_rows[:-1])
    alike = {rows_alike(p.weight) for p in projections(auto)}
    assert len(alike) == 1, "every projection of the tiny file packs alike"
    assert torch.equal(x8_rows[-1], int4_rows[-1]) == alike.pop()
    assert (x8_rows[-1] - expected[-1]).abs().max().item() <= 0.05 * scale


def test_float32_greedy_tokens_are_unchanged(x8_file, quant_ops, monkeypatch):
    """float32 auto reads the file's blocks in place against float32 activations (exact
    values), never the x8 form: its greedy tokens are the dense model's."""
    monkeypatch.setenv(Q4_KERNEL_ENV, "x8")
    dense, auto = engine(x8_file, "dense"), engine(x8_file, "auto")
    assert all(p.x8 is None for p in projections(auto))
    ids = dense.tokenizer.encode(PROMPT)
    assert greedy(auto, ids) == greedy(dense, ids)

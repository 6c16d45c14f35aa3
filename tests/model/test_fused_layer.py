"""A decoder layer's decode step in one extension call (models/fused_layer.py) is the layer's
Python path, bit for bit: a property over layouts, and on files whose projections read the
file's blocks (tiny random Q4_K, Q6_K and Q8_0 models, bf16 and float32, auto and native).

The default model in bfloat16 with `--weights auto` (every projection reads its x8 form at
decode rows), K/V in bfloat16 or int8, lanes decoding together in reserved or pooled chunks of 16 or 64 cells,
without a ring, through a ring that holds everything and through rings of one or two
16-cell pages (the newest page streams, so new K/V goes to staging): the same engine runs
the same requests with its layers' one-call forms and without them, and every step's
logits are equal, not close. The one-call form runs at every decode step it can take.
bfloat16 here is safe on any CPU: each test compares two paths in one process on the same
CPU (the same kernels either way), never text or tokens against fixed values; float32 is
covered by the tiny files' case.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from gguf import GGMLQuantizationType as QT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.models.fused_layer import quantized_form
from strata.models.q4x8 import Q8X8_TYPES
from strata.sampling import SamplingParams
from tests.conftest import FUSED_ONLY
from tests.model.engine_runs import run_requests
from tests.model.test_gguf_native import TIED, fields, tiny_file  # noqa: F401 (fixture)
from tests.model.tiny_gguf import VOCAB

pytestmark = pytest.mark.skipif(not FUSED_ONLY, reason="the one-call layer is made of the fused ops (AVX2)")

MAX_CONTEXT = 128
NEW = 6
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def engines(gguf_path, decode_ops, quant_ops):
    @functools.cache
    def get(pooled: bool, chunk: int, ring_pages: int | None, kv: str | None = None) -> Engine:
        pool = {"kv_pool_tokens": 3 * (MAX_CONTEXT // chunk + 1) * chunk} if pooled else {}
        ring = {}
        if ring_pages is not None:
            ring = {"kv_resident": ring_pages * 16 if ring_pages else MAX_CONTEXT, "kv_page": 16,
                    "kv_ring_adapt": False}
        return Engine(EngineConfig(model=gguf_path, dtype="bfloat16", weights="auto", max_context=MAX_CONTEXT,
                                   kv_chunk=chunk, batch=2, prefill_chunk=24, spec="off", kv=kv, **pool, **ring),
                      progress=False)

    return get


def recorded(engine: Engine, prompts: list[list[int]], one_call: bool) -> tuple[list, list, int]:
    """(tokens, every forward's logits, steps whose layers all ran in one call each), with the
    layers' one-call forms or without them."""
    model = engine._model
    forms = [layer.fused for layer in model.layers]
    calls = [0]

    def counted(form):
        def call(*args):
            y = form(*args)
            calls[0] += y is not None
            return y
        return call

    logits = []

    def forward(*args):
        out = type(model).forward(model, *args)
        logits.append(out.clone())
        return out

    engine._scheduler.clear_cache()
    for layer, form in zip(model.layers, forms):
        layer.fused = counted(form) if one_call else None
    model.forward = forward
    try:
        tokens = run_requests(engine, prompts, GREEDY, lambda e: e._ring is not None and e._ring.check())
    finally:
        del model.forward
        for layer, form in zip(model.layers, forms):
            layer.fused = form
    return tokens, logits, calls[0] // len(model.layers)


def test_the_default_model_has_a_one_call_form_only_where_it_reads_quantized_weights(engines, gguf_path):
    auto = engines(False, 16, None)  # bf16: the x8 pack
    assert all(layer.fused is not None and all(p.x8 is not None for p in layer.fused.projections)
               for layer in auto._model.layers)
    f32 = Engine(EngineConfig(model=gguf_path, dtype="float32", weights="auto", max_context=64), progress=False)
    assert all(layer.fused is not None and all(p.quant is not None for p in layer.fused.projections)
               for layer in f32._model.layers)  # float32: the file's blocks, exact values
    dense = Engine(EngineConfig(model=gguf_path, dtype="bfloat16", weights="dense", max_context=64), progress=False)
    assert all(layer.fused is None for layer in dense._model.layers)


def test_the_one_call_form_takes_only_steps_its_projections_read_quantized(engines):
    """Its row bound is the projections' (a dense weight beside the 4-bit form reads the 4-bit
    form up to max_rows decode rows): a step of more rows is left to the Python path before any
    K/V is looked at."""
    model = engines(False, 16, None)._model
    for layer in model.layers:
        bound = min((p.max_rows for p in layer.fused.projections if p.weight is not None), default=math.inf)
        assert layer.fused.max_rows == bound
    fused = model.layers[0].fused
    x = torch.zeros(fused.max_rows + 1, model.cfg.hidden_size)  # refused on its row count alone
    assert fused(x, None, None, None, None, None, None) is None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pooled=st.booleans(), chunk=st.sampled_from([16, 64]), ring=st.sampled_from([None, 0, 1, 2]),
       kv=st.sampled_from([None, "int8"]), lengths=st.lists(st.integers(1, 70), min_size=1, max_size=3),
       seed=st.integers(0, 2**16))
def test_the_one_call_layer_is_the_python_path_bit_for_bit(engines, pooled, chunk, ring, kv, lengths, seed):
    """With int8 K/V too: the one call quantises the new rows where it writes them and reads the
    cells with their scales, as the Python path's fused ops do."""
    engine = engines(pooled, chunk, ring, kv)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 40000, (n,), generator=g).tolist() for n in lengths]
    want_tokens, want_logits, none = recorded(engine, prompts, one_call=False)
    got_tokens, got_logits, steps = recorded(engine, prompts, one_call=True)
    assert none == 0
    assert got_tokens == want_tokens
    assert len(got_logits) == len(want_logits)
    assert all(torch.equal(a, b) for a, b in zip(got_logits, want_logits))
    # every step after the prompts is a decode step of at most 3 rows: each ran in one call
    # (a step with prompt rows beside decode rows takes the Python path)
    assert steps >= NEW - 1


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0, QT.Q5_0], ids=lambda t: t.name)
@pytest.mark.parametrize("dtype,weights", [("bfloat16", "auto"), ("bfloat16", "native"), ("float32", "auto")])
def test_layers_reading_the_files_blocks_are_their_python_path_bit_for_bit(  # noqa: F811 (the imported fixture)
        qtype, dtype, weights, tmp_path, fields, decode_ops, quant_ops):
    path = tiny_file(tmp_path, qtype, fields, tied=qtype in TIED)
    engine = Engine(EngineConfig(model=path, dtype=dtype, weights=weights, max_context=96, kv_chunk=16, batch=2,
                                 prefill_chunk=7, spec="off"), progress=False)
    layers = engine._model.layers  # the file's blocks, or (Q8_0, Q5_0 in bf16 auto) their q8x8 form
    assert all(layer.fused is not None and all(quantized_form(p) is not None for p in layer.fused.projections)
               for layer in layers)
    q8x8 = qtype in Q8X8_TYPES and dtype == "bfloat16" and weights == "auto"
    assert all((p.x8 is not None) == q8x8 for layer in layers for p in layer.fused.projections)
    g = torch.Generator().manual_seed(int(qtype))
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 17, 30)]
    want_tokens, want_logits, _ = recorded(engine, prompts, one_call=False)
    got_tokens, got_logits, steps = recorded(engine, prompts, one_call=True)
    assert got_tokens == want_tokens and steps >= NEW - 1
    assert len(got_logits) == len(want_logits) and all(torch.equal(a, b) for a, b in zip(got_logits, want_logits))


@pytest.mark.parametrize("ring_pages", [None, 0, 2], ids=["no ring", "ring holding all", "ring of 2 pages"])
def test_verify_steps_run_in_one_call_through_the_ring_too(gguf_path, decode_ops, quant_ops, ring_pages):
    """A verify step's few rows are read as decode rows through the ring (runner/ring_reads.py) as
    without it: each layer runs in one call, its logits those of the layer's Python path
    (float32: the file's blocks at their exact values, the same on every CPU)."""
    ring = {} if ring_pages is None else {"kv_resident": ring_pages * 16 if ring_pages else MAX_CONTEXT,
                                          "kv_page": 16, "kv_ring_adapt": False}
    engine = Engine(EngineConfig(model=gguf_path, dtype="float32", weights="auto", max_context=MAX_CONTEXT,
                                 kv_chunk=16, batch=2, prefill_chunk=24, spec="ngram", **ring), progress=False)
    model = engine._model
    tok = engine.tokenizer
    prompts = [tok.encode("a b c d e f g " * 3 + "a b c")]  # continued by copying: n-gram drafts
    rows_in_one_call = []

    def counting(form):
        def call(x, *args):
            y = form(x, *args)
            if y is not None:
                rows_in_one_call.append(x.shape[0])
            return y
        return call

    want_tokens, want_logits, _ = recorded(engine, prompts, one_call=False)
    forms = [layer.fused for layer in model.layers]
    for layer, form in zip(model.layers, forms):
        layer.fused = counting(form)
    try:
        got_tokens, got_logits, _ = recorded(engine, prompts, one_call=True)
    finally:
        for layer, form in zip(model.layers, forms):
            layer.fused = form
    assert got_tokens == want_tokens
    assert len(got_logits) == len(want_logits) and all(torch.equal(a, b) for a, b in zip(got_logits, want_logits))
    assert max(rows_in_one_call) > 1  # some step verified drafts, in one call per layer

"""Greedy Gemma 3 output with sliding windows is the same whatever the memory layout (a property).

The tiny random gemma3_text model of test_gemma3.py (window 8, sliding and global layers)
answers like transformers in float32 in every layout: reserved or pooled (`--kv-pool-tokens`),
chunks of 4, 8, 16 and 32 cells (below, at and above the window), several lanes at once,
the fused decode kernel or torch's reads (in place, strided, gathered, run by run), K/V read
through a ring of one or two 16-cell pages (`--kv-resident`), after a lane move, a park and a
branch from an earlier turn, and with n-gram drafts verified (an oracle drafter, as
test_spec_layouts.py). int8 K/V (`--kv int8`) is compared with int8 K/V in the reserved
layout cold, as test_layouts.py does.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.sampling import SamplingParams
from tests.checks import check_scheduler
from tests.conftest import require
from tests.model.engine_runs import move_or_park, run_requests
from tests.model.spec_oracle import OracleDrafter
from tests.model.test_gemma3 import tiny_gemma3_dir

transformers = require("transformers")

MAX_CONTEXT = 96
NEW = 8
PAGE = 16
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
# (pooled, chunk, ring pages (None: no ring), K/V, reads: "fused" kernel, "torch" or "runs")
FLOAT_LAYOUTS = [(False, 4, None, "f32", "fused"), (False, 8, None, "f32", "torch"), (False, 16, None, "f32", "fused"),
                 (True, 4, None, "f32", "torch"), (True, 8, None, "f32", "fused"), (True, 16, None, "f32", "torch"),
                 (True, 4, None, "f32", "runs"), (False, 32, 1, "f32", "torch"), (True, 16, 2, "f32", "torch")]
INT8_LAYOUTS = [(False, 8, None, "int8", "torch"), (True, 4, None, "int8", "torch"), (True, 16, 2, "int8", "torch")]
LAYOUTS = FLOAT_LAYOUTS + INT8_LAYOUTS

prompts_st = st.lists(st.integers(3, 40000), min_size=1, max_size=30)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, smol_tokenizer):
    return tiny_gemma3_dir(tmp_path_factory, smol_tokenizer)


@pytest.fixture(scope="module")
def engines(model_dir):
    @functools.cache
    def get(pooled: bool, chunk: int, ring: int | None, kv: str, reads: str, spec: str = "off",
            batch: int = 2) -> Engine:
        per_lane = -(-MAX_CONTEXT // chunk) + 1
        extra = {"kv_pool_tokens": (batch + 1) * per_lane * chunk} if pooled else {}
        if ring is not None:
            extra |= {"kv_resident": ring * PAGE, "kv_page": PAGE, "kv_ring_adapt": False}
        cfg = EngineConfig(model=model_dir, dtype="float32", max_context=MAX_CONTEXT, kv_chunk=chunk, batch=batch,
                           prefill_chunk=5, kv=kv, fused=reads == "fused", spec=spec, spec_k=4, **extra)
        engine = Engine(cfg, progress=False)
        if reads == "runs":
            engine._runner.lanes.cells.runs_min_cells = 1
        return engine

    return get


@pytest.fixture(scope="module")
def reference(model_dir, engines):
    """A prompt's greedy tokens: transformers' (float32), or int8 K/V's cold in the reserved layout."""
    ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    @functools.cache
    def tokens(prompt: tuple[int, ...], kv: str) -> list[int]:
        if kv == "int8":
            engine = engines(False, 64, None, "int8", "torch")
            engine._scheduler.clear_cache()
            return run(engine, [list(prompt)])[0]
        with torch.inference_mode():
            out = ref.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                               pad_token_id=0)
        return out[0, len(prompt):].tolist()

    return lambda prompt, kv: tokens(tuple(prompt), kv)


def run(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    return run_requests(engine, prompts, GREEDY, lambda e: e._ring is not None and e._ring.check())


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(prompts_st, min_size=1, max_size=3), layout=st.sampled_from(LAYOUTS))
def test_batched_equals_transformers(engines, reference, prompts, layout):
    engine = engines(*layout)
    engine._scheduler.clear_cache()
    assert run(engine, prompts) == [reference(p, layout[3]) for p in prompts]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=prompts_st, follow=st.lists(st.integers(3, 40000), min_size=1, max_size=12),
       layout=st.sampled_from(LAYOUTS), action=st.sampled_from(["stay", "move", "park"]))
def test_follow_up_after_move_or_park_equals_transformers(engines, reference, first, follow, layout, action):
    engine = engines(*layout)
    engine._scheduler.clear_cache()
    (out,) = run(engine, [first])
    if action != "stay":
        move_or_park(engine, action)
    check_scheduler(engine._scheduler)
    prompt = first + out + follow
    assert run(engine, [prompt])[0] == reference(prompt, layout[3])
    assert engine._scheduler.counters.num_cached_tokens > 0


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.lists(st.integers(3, 40000), min_size=4, max_size=30), cut=st.floats(0.1, 0.9),
       branch=st.lists(st.integers(3, 40000), min_size=1, max_size=12), layout=st.sampled_from(LAYOUTS),
       concurrent=st.booleans())
def test_branch_equals_transformers(engines, reference, first, cut, branch, layout, concurrent):
    engine = engines(*layout)
    engine._scheduler.clear_cache()
    prompt = first[: max(1, int(len(first) * cut))] + branch
    if concurrent:
        a, b = run(engine, [first, prompt])
        assert a == reference(first, layout[3])
    else:
        run(engine, [first])
        b = run(engine, [prompt])[0]
    assert b == reference(prompt, layout[3])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(prompts_st, min_size=1, max_size=2), layout=st.sampled_from(FLOAT_LAYOUTS),
       wrong_every=st.sampled_from([2, 3, 5]))
def test_drafts_verified_through_windows_equal_transformers(engines, reference, prompts, layout, wrong_every):
    """Verify rows (the pending token and its drafts) read their windows as a prefill piece does."""
    engine = engines(*layout, spec="ngram")
    engine._scheduler.clear_cache()
    want = [reference(p, "f32") for p in prompts]
    oracle = OracleDrafter(wrong_every)
    oracle.reference = [p + out for p, out in zip(prompts, want)]
    engine._scheduler.drafts.drafter = oracle
    before = engine._scheduler.drafts.counters.num_accepted
    assert run(engine, prompts) == want
    assert engine._scheduler.drafts.counters.num_accepted > before

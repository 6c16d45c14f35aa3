"""Speculative decoding (`--spec ngram`) gives the tokens decoding one at a time gives.

A tiny random model never repeats itself, so n-gram drafts would rarely be proposed on it:
the property tests use a drafter that knows the no-draft run's answer and gets every 2nd,
3rd or 5th token wrong (spec_oracle.py), so verify steps keep all, some or none of their
drafts. Greedy output with drafts equals output without, on a tiny model in float32,
several lanes at once, both layouts, chunks of 16 and 64, through a ring of two pages,
across a lane move and a park. Rejected drafts' cells are given back: after a run the pool
(free list, refcounts, every table) is exactly as a run that never drafted. When every
draft is rejected, k falls to 0. The real n-gram drafter runs on the default model in
float32, where it keeps most of its drafts on text that repeats the prompt.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.config import EngineConfig
from strata.drafting.adaptive import PROBE_EVERY
from strata.engine.engine import Engine
from strata.sampling import SamplingParams
from tests.model.engine_runs import move_or_park, run_requests, tables_are_tight
from tests.model.spec_oracle import OracleDrafter

MAX_CONTEXT = 192
NEW = 16
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
# (pooled, chunk, ring pages)
LAYOUTS = [(p, c, r) for p in (False, True) for c in (16, 64) for r in (None, 2)]


prompts_st = st.lists(st.integers(3, 40000), min_size=1, max_size=80)


@pytest.fixture(scope="module")
def engines(tiny_llama_dir):
    @functools.cache
    def get(pooled: bool, chunk: int, ring: int | None, spec: str, batch: int = 2) -> Engine:
        per_lane = -(-MAX_CONTEXT // chunk) + 1
        extra = {"kv_pool_tokens": (batch + 1) * per_lane * chunk} if pooled else {}
        if ring is not None:
            extra |= {"kv_resident": ring * 16, "kv_page": 16, "kv_ring_adapt": False}
        cfg = EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=MAX_CONTEXT, kv_chunk=chunk,
                           batch=batch, prefill_chunk=13, spec=spec, spec_k=4, **extra)
        return Engine(cfg, progress=False)

    return get


def run(engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY,
        tight: bool = False) -> list[list[int]]:
    """Greedy tokens; `tight`: after every step each table holds only the chunks its cells need."""
    return run_requests(engine, prompts, params, tables_are_tight if tight else None)


def with_oracle(engine: Engine, wrong_every: int = 3) -> OracleDrafter:
    oracle = OracleDrafter(wrong_every)
    engine._scheduler.drafts.drafter = oracle
    return oracle


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(prompts_st, min_size=1, max_size=3), layout=st.sampled_from(LAYOUTS),
       wrong_every=st.sampled_from([2, 3, 5]))
def test_drafts_give_the_same_greedy_tokens(engines, prompts, layout, wrong_every):
    spec, plain = engines(*layout, "ngram"), engines(*layout, "off")
    for e in (spec, plain):
        e._scheduler.clear_cache()
    want = run(plain, prompts)
    oracle = with_oracle(spec, wrong_every)
    oracle.reference = [p + out for p, out in zip(prompts, want)]
    before = spec._scheduler.drafts.counters.num_accepted
    assert run(spec, prompts) == want
    assert spec._scheduler.drafts.counters.num_accepted > before  # drafts were verified and kept


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=prompts_st, follow=st.lists(st.integers(3, 40000), min_size=1, max_size=10),
       layout=st.sampled_from(LAYOUTS), action=st.sampled_from(["move", "park"]))
def test_follow_up_after_move_or_park_with_drafts(engines, first, follow, layout, action):
    spec, plain = engines(*layout, "ngram"), engines(*layout, "off")
    oracle = with_oracle(spec)
    results = []
    for e in (plain, spec):
        e._scheduler.clear_cache()
        (out,) = run(e, [first])
        move_or_park(e, action)
        second = first + out + follow
        results.append((out, run(e, [second])[0]))
        oracle.reference = [first + out, second + results[0][1]]
    assert results[0] == results[1]


def pool_state(engine: Engine) -> tuple:
    pool = engine._layout.pool
    tables = sorted((tuple(c.table.chunk_ids), c.table.num_cells, tuple(c.token_ids)) for c in engine._scheduler.cache)
    return list(pool._free), list(pool._refcounts), tables


@pytest.mark.parametrize("pooled", [False, True])
def test_rollback_leaves_the_pool_as_a_run_that_never_drafted(tiny_llama_dir, pooled):
    prompts = [[21, 22, 23, 24] * 5, [31, 32, 33] * 7 + [5]]
    states, want = [], None
    for spec in ("off", "ngram"):
        extra = {"kv_pool_tokens": 3 * 13 * 16} if pooled else {}
        engine = Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=MAX_CONTEXT, kv_chunk=16,
                                     batch=2, spec=spec, **extra), progress=False)
        if spec == "ngram":
            with_oracle(engine).reference = [p + out for p, out in zip(prompts, want)]
        got = run(engine, prompts, tight=pooled)
        if spec == "ngram":
            c = engine._scheduler.drafts.counters
            assert got == want and c.num_drafted > c.num_accepted > 0  # some drafts rejected, some kept
        want = got
        states.append(pool_state(engine))
    assert states[0] == states[1]


def test_k_falls_to_zero_when_every_draft_is_rejected(tiny_llama_dir):
    """Drafts that are always wrong (random text to the model): k falls to 0, and from then
    on only a probe every PROBE_EVERY steps drafts."""
    engine = Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=512, spec="ngram"),
                    progress=False)
    prompt = [7, 8, 9] * 10
    plain = Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=512), progress=False)
    (out,) = run(plain, [prompt], SamplingParams(temperature=0, max_tokens=120, ignore_eos=True))
    with_oracle(engine, wrong_every=1).reference = [prompt + out]
    rid = engine.submit(prompt, SamplingParams(temperature=0, max_tokens=120, ignore_eos=True))
    ks, got = [], []
    while engine.has_work:
        seq = engine._scheduler.seqs.get(rid)
        if seq is not None and seq.spec is not None:
            ks.append(seq.spec.k.k())
        got += [t for o in engine.step() for t in o.new_token_ids]
    c = engine._scheduler.drafts.counters
    assert got == out and c.num_accepted == 0 and c.num_drafted > 0
    probes = -(-64 // (PROBE_EVERY + 1))  # k = 1 once in PROBE_EVERY + 1 steps
    assert ks[-64:].count(0) >= 64 - probes


def test_default_model_greedy_with_drafts_equals_without(gguf_path):
    text = "def add(a, b):\n    return a + b\n\n" * 3
    messages = [{"role": "user", "content": "Repeat exactly:\n" + text}]
    out = {}
    for spec in ("ngram", "off"):
        engine = Engine(EngineConfig(model=gguf_path, dtype="float32", max_context=1024, spec=spec), progress=False)
        engine.submit(engine.tokenizer.encode_chat(messages), SamplingParams(temperature=0, max_tokens=40))
        outs = engine.run_until_done()
        out[spec] = [t for o in outs for t in o.new_token_ids]
        if spec == "ngram":
            assert engine._scheduler.drafts.counters.num_accepted > 10
            assert outs[-1].timings.draft_n >= outs[-1].timings.draft_n_accepted > 10
    assert out["ngram"] == out["off"]

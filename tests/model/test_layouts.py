"""Greedy output is the same, token for token, whatever the memory layout (a property).

The reference is one conversation at a time, cold, in the reserved layout with 4096-cell
chunks. Every other arrangement (pooled or reserved, chunk sizes 16/64/4096, several
lanes at once with prompts of different lengths, a lane move, a park and restore, a
branch from an earlier turn, a cpu,cpu layer split, K/V read through a gather, a strided
view or run by run) must give the same tokens.

Each property also runs with int8 K/V (`--kv int8`, against an int8 reference) on a subset
of the layouts: pooled and reserved, chunks of 16 and 64, run by run, the cpu,cpu split;
with moves, parks, branches and shared prefixes as drawn. Every read path dequantises the
same stored int8 values, so int8 output is as layout-independent as float32's.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.sampling import SamplingParams
from tests.model.engine_runs import run_requests
from tests.checks import check_scheduler

MAX_CONTEXT = 192
NEW = 8
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)

FLOAT_LAYOUTS = [
    (pooled, chunk, devices, "default")
    for pooled in (False, True)
    for chunk in (16, 64, 4096)
    for devices in (("cpu",), ("cpu", "cpu"))
    if devices == ("cpu",) or chunk == 16
] + [(True, 16, ("cpu",), "runs")]  # lanes in a few runs of chunks read run by run however short
INT8_LAYOUTS = [(False, 16, ("cpu",), "default"), (False, 64, ("cpu",), "default"), (True, 16, ("cpu",), "default"),
                (True, 64, ("cpu",), "default"), (True, 16, ("cpu", "cpu"), "default"), (True, 16, ("cpu",), "runs")]
# (pooled, chunk, devices, reads, K/V dtype)
LAYOUTS = [(*layout, "f32") for layout in FLOAT_LAYOUTS] + [(*layout, "int8") for layout in INT8_LAYOUTS]

prompts_st = st.lists(st.integers(3, 40000), min_size=1, max_size=60)


@pytest.fixture(scope="module")
def engines(tiny_llama_dir):
    @functools.cache
    def get(pooled: bool, chunk: int, devices: tuple[str, ...], reads: str = "default", kv: str = "f32",
            batch: int = 3) -> Engine:
        # Room for every lane's whole context plus a partial chunk per fork: no pool-full path here.
        per_lane = -(-MAX_CONTEXT // chunk) + 1
        pool = {"kv_pool_tokens": (batch + 1) * per_lane * chunk} if pooled else {}
        cfg = EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=MAX_CONTEXT, kv_chunk=chunk,
                           batch=batch, prefill_chunk=13, devices=devices, kv=kv, **pool)
        engine = Engine(cfg, progress=False)
        if reads == "runs":
            engine._runner.lanes.cells.runs_min_cells = 1
        return engine

    return get


def run(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy tokens for `prompts`, all submitted at once; checks the pool after every step."""
    return run_requests(engine, prompts, GREEDY)


def reference(engines, prompt: list[int], kv: str = "f32") -> list[int]:
    engine = engines(False, 4096, ("cpu",), kv=kv)
    engine._scheduler.clear_cache()
    return run(engine, [prompt])[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(prompts_st, min_size=1, max_size=4), layout=st.sampled_from(LAYOUTS))
def test_batched_equals_one_at_a_time(engines, prompts, layout):
    engine = engines(*layout)
    engine._scheduler.clear_cache()
    assert run(engine, prompts) == [reference(engines, p, layout[-1]) for p in prompts]


@settings(max_examples=32, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=prompts_st, follow=st.lists(st.integers(3, 40000), min_size=1, max_size=20),
       layout=st.sampled_from(LAYOUTS), action=st.sampled_from(["stay", "move", "park"]))
def test_follow_up_after_move_or_park_equals_cold(engines, first, follow, layout, action):
    engine = engines(*layout)
    engine._scheduler.clear_cache()
    (out,) = run(engine, [first])
    lane = next(lane.index for lane in engine._scheduler.lanes if lane.conv is not None)
    if action == "move":
        engine.move(lane, (lane + 2) % len(engine._scheduler.lanes))
    elif action == "park":
        engine.park(lane)
    check_scheduler(engine._scheduler)
    prompt = first + out + follow
    got = run(engine, [prompt])[0]
    assert engine._scheduler.counters.num_cached_tokens > 0
    assert got == reference(engines, prompt, layout[-1])


@settings(max_examples=32, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.lists(st.integers(3, 40000), min_size=4, max_size=60), cut=st.floats(0.1, 0.9),
       branch=st.lists(st.integers(3, 40000), min_size=1, max_size=20), layout=st.sampled_from(LAYOUTS),
       concurrent=st.booleans())
def test_branch_equals_cold(engines, first, cut, branch, layout, concurrent):
    """A prompt sharing only a prefix of a cached (or still running) conversation."""
    engine = engines(*layout)
    engine._scheduler.clear_cache()
    prompt = first[: max(1, int(len(first) * cut))] + branch
    if concurrent:
        a, b = run(engine, [first, prompt])
        assert a == reference(engines, first, layout[-1])
    else:
        run(engine, [first])
        b = run(engine, [prompt])[0]
    assert b == reference(engines, prompt, layout[-1])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(system_len=st.sampled_from([16, 33, 47, 64]), chunk=st.sampled_from([16, 64]), kv=st.sampled_from(["f32", "int8"]),
       arrival=st.sampled_from(["one by one", "while running", "together"]),
       questions=st.lists(st.lists(st.integers(3, 40000), min_size=1, max_size=12), min_size=2, max_size=4))
def test_shared_system_prompt_equals_cold(engines, system_len, chunk, kv, arrival, questions):
    """Conversations sharing one system prompt (ending on and inside chunk borders) hold its
    full chunks once: forked from the first one, parked or still running, or computed
    together and then adopted (engine/dedup.py); each answers token for token as it would
    alone and cold (no sharing)."""
    engine = engines(True, chunk, ("cpu",), kv=kv)
    engine._scheduler.clear_cache()
    cached_before = engine._scheduler.counters.num_cached_tokens
    system = [3 + (i * 7919) % 40000 for i in range(system_len)]
    prompts = [system + q for q in questions]
    if arrival == "while running":  # the first is still decoding when the others arrive
        ids = [engine.submit(prompts[0], GREEDY)]
        tokens = {ids[0]: []}
        while not any(c.num_cells > system_len for c in engine._scheduler.cache):
            for out in engine.step():
                tokens[out.request_id].extend(out.new_token_ids)
        ids += [engine.submit(p, GREEDY) for p in prompts[1:]]
        tokens.update({i: [] for i in ids[1:]})
        shared = 0
        while engine.has_work:
            for out in engine.step():
                assert out.error is None and not out.truncated
                tokens[out.request_id].extend(out.new_token_ids)
            check_scheduler(engine._scheduler)
            shared = max(shared, engine._scheduler.stats().num_chunks_shared)
        got = [tokens[i] for i in ids]
    elif arrival == "together":
        got = run(engine, prompts)
        shared = engine._scheduler.stats().num_chunks_shared
    else:
        got = [run(engine, [p])[0] for p in prompts]
        shared = engine._scheduler.stats().num_chunks_shared
    if arrival != "together":
        assert engine._scheduler.counters.num_cached_tokens - cached_before >= (len(prompts) - 1) * system_len
    assert shared >= system_len // chunk  # the system prompt's full chunks, held once
    assert got == [reference(engines, p, kv) for p in prompts]

"""Drafting with a draft model (`--spec draft`): two tiny random models with the same tokenizer.

The draft model's K/V lives in the same chunks as the target's (the conversation's chunk
table addresses both), so greedy output must equal decoding without drafts in both layouts,
across a move (reserved: the copy takes the drafter's cells too) and a park, while the
drafter's state follows the conversation. With the target itself as the draft model every
draft is the target's own greedy token: nearly all are kept, which shows the drafter's K/V
is right (a wrong cell would make it propose something else); a different random model's
drafts are mostly rejected, and the output is still exact.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.sampling import SamplingParams
from tests.conftest import make_tiny_model
from tests.model.engine_runs import move_or_park, run_requests, tables_are_tight

MAX_CONTEXT = 192
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
prompts_st = st.lists(st.integers(3, 40000), min_size=1, max_size=60)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory, smol_tokenizer) -> str:
    return make_tiny_model("qwen2", str(tmp_path_factory.mktemp("tiny-qwen2")), smol_tokenizer)


@pytest.fixture(scope="module")
def engines(tiny_llama_dir, qwen_dir):
    @functools.cache
    def get(pooled: bool, chunk: int, draft: str | None) -> Engine:
        extra = {"kv_pool_tokens": 3 * (-(-MAX_CONTEXT // chunk) + 1) * chunk} if pooled else {}
        if draft is not None:
            extra |= {"spec": "draft", "draft_model": {"self": tiny_llama_dir, "other": qwen_dir}[draft]}
        return Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=MAX_CONTEXT, kv_chunk=chunk,
                                   batch=2, prefill_chunk=13, **extra), progress=False)

    return get


def run(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    return run_requests(engine, prompts, GREEDY, tables_are_tight if engine._layout.holds_parked else None)


def counters(engine: Engine):
    return engine._scheduler.drafts.counters


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(prompts_st, min_size=1, max_size=3), pooled=st.booleans(), chunk=st.sampled_from([16, 64]),
       draft=st.sampled_from(["self", "other"]))
def test_greedy_with_a_draft_model_equals_without(engines, prompts, pooled, chunk, draft):
    spec, plain = engines(pooled, chunk, draft), engines(pooled, chunk, None)
    for e in (spec, plain):
        e._scheduler.clear_cache()
    before = counters(spec).num_accepted, counters(spec).num_drafted
    assert run(spec, prompts) == run(plain, prompts)
    accepted, drafted = counters(spec).num_accepted - before[0], counters(spec).num_drafted - before[1]
    assert drafted > 0
    if draft == "self":
        assert accepted >= 0.9 * drafted  # the target's own greedy tokens


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=prompts_st, follow=st.lists(st.integers(3, 40000), min_size=1, max_size=10), pooled=st.booleans(),
       action=st.sampled_from(["move", "park"]))
def test_the_drafters_state_follows_a_move_or_park(engines, first, follow, pooled, action):
    spec, plain = engines(pooled, 16, "self"), engines(pooled, 16, None)
    results = []
    for e in (plain, spec):
        e._scheduler.clear_cache()
        (out,) = run(e, [first])
        move_or_park(e, action)
        results.append((out, run(e, [first + out + follow])[0]))
    assert results[0] == results[1]
    conv = next(c for c in spec._scheduler.cache if c.token_ids[: len(first)] == first)
    assert conv.draft_cells > len(first)  # the follow-up fed on from the moved/parked drafter K/V


def test_a_different_vocabulary_is_refused(tiny_llama_dir, tmp_path, smol_tokenizer):
    from strata.errors import ConfigError

    small = make_tiny_model("llama", str(tmp_path / "v"), smol_tokenizer, vocab_size=1000)
    with pytest.raises(ConfigError, match="--draft-model"):
        Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=64, spec="draft", draft_model=small),
               progress=False)

"""A mixture-of-experts model gives the same greedy tokens whatever the memory layout and
however its rows are batched (a property).

The model is the tiny Qwen2-MoE of test_moe_parity.py (8 experts, 3 per token, a shared
expert, one dense layer). The reference runs one conversation at a time, cold, reserved,
4096-cell chunks, no ring, no drafts. Every other arrangement (pooled or reserved, chunks
of 16 or 64, a resident ring of 2 pages, a cpu,cpu layer split, drafts verified in the same
step as other lanes' decode and prefill rows, up to 3 lanes at once) must give the same
tokens: each row's experts, and so its output, do not depend on the rows beside it. A
session file saved from one MoE engine and restored into another goes on as the
conversation never saved.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.sampling import SamplingParams
from tests.conftest import require
from tests.model.engine_runs import run_requests
from tests.model.spec_oracle import OracleDrafter
from tests.model.test_moe_parity import tiny_moe_dir

require("transformers")

MAX_CONTEXT = 160
NEW = 8
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
# (pooled, chunk, ring pages or None, split across cpu,cpu, drafts)
LAYOUTS = [(p, c, r, False, s) for p in (False, True) for c in (16, 64) for r in (None, 2) for s in (False, True)] \
    + [(True, 16, None, True, False), (False, 64, 2, True, True)]

prompts_st = st.lists(st.integers(3, 40000), min_size=1, max_size=50)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory, smol_tokenizer) -> str:
    return tiny_moe_dir("qwen2_moe", tmp_path_factory, smol_tokenizer)


@pytest.fixture(scope="module")
def engines(moe_dir):
    path = moe_dir

    @functools.cache
    def get(pooled: bool, chunk: int, ring: int | None, split: bool, spec: bool, batch: int = 3) -> Engine:
        per_lane = -(-MAX_CONTEXT // chunk) + 1
        extra = {"kv_pool_tokens": (batch + 1) * per_lane * chunk} if pooled else {}
        if ring is not None:
            extra |= {"kv_resident": ring * 16, "kv_page": 16, "kv_ring_adapt": False}
        cfg = EngineConfig(model=path, dtype="float32", max_context=MAX_CONTEXT, kv_chunk=chunk, batch=batch,
                           prefill_chunk=13, devices=("cpu", "cpu") if split else ("cpu",),
                           spec="ngram" if spec else "off", spec_k=3, **extra)
        return Engine(cfg, progress=False)

    return get


def reference(engines, prompt: list[int]) -> list[int]:
    engine = engines(False, 4096, None, False, False, batch=1)
    engine._scheduler.clear_cache()
    return run_requests(engine, [prompt], GREEDY)[0]


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(prompts_st, min_size=1, max_size=3), layout=st.sampled_from(LAYOUTS))
def test_moe_greedy_is_the_same_in_every_layout(engines, prompts, layout):
    want = [reference(engines, p) for p in prompts]
    engine = engines(*layout)
    engine._scheduler.clear_cache()
    if layout[-1]:  # drafts: the continuation the reference chose, every 3rd token wrong
        oracle = OracleDrafter(3)
        oracle.reference = [p + out for p, out in zip(prompts, want)]
        engine._scheduler.drafts.drafter = oracle
    assert run_requests(engine, prompts, GREEDY) == want


def test_a_session_file_round_trips_between_moe_engines(engines, tmp_path):
    turn1, turn2 = list(range(100, 137)), list(range(700, 719))
    ref = engines(False, 4096, None, False, False, batch=1)
    ref._scheduler.clear_cache()
    out1 = run_requests(ref, [turn1], GREEDY)[0]
    out2 = run_requests(ref, [turn1 + out1 + turn2], GREEDY)[0]
    a = engines(True, 16, None, False, False)
    a._scheduler.clear_cache()
    assert run_requests(a, [turn1], GREEDY)[0] == out1
    path = str(tmp_path / "moe.strata")
    history = turn1 + out1[:-1]  # the last sampled token was never fed: it has no K/V
    assert a.save_session(path, token_ids=history).num_cells == len(history)
    b = engines(False, 64, 2, False, False)
    b._scheduler.clear_cache()
    assert b.restore_session(path, lane=1).num_cells == len(history)
    rid = b.submit(turn1 + out1 + turn2, GREEDY)
    got, cached = [], None
    for out in b.run_until_done():
        assert out.error is None and out.request_id == rid
        got += out.new_token_ids
        cached = out.num_cached_tokens
    assert got == out2 and cached == len(history)  # the follow-up read the restored K/V

"""Layer groups (kv/groups.py) give the same greedy tokens as the layout that keeps every cell.

Tiny random Gemma 3 (sliding and global layers) and Mistral-style (every layer windowed)
models, float32 (and int8 K/V), windows of 8 to 64 cells, chunks of 4 to 64: the pooled layout, whose
windowed groups hold only the window of each conversation's next token, answers every
request (several lanes at once, growth past many windows, follow-ups, branches from early
and late turns, lane moves and parks, n-gram drafts verified) with the tokens of the
reserved layout, which keeps every cell of every layer. After every step the scheduler's
invariants hold (tests/checks.py: each group's refcounts, no passed chunk held) and every
conversation holds at most ceil(window / chunk) + 1 chunks in each windowed group.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.kv.groups import window_bound
from strata.sampling import SamplingParams
from tests.conftest import make_tiny_model, require
from tests.model.engine_runs import move_or_park, run_requests
from tests.model.spec_oracle import OracleDrafter

require("transformers")

MAX_CONTEXT = 192
NEW = 10
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
WINDOWS = (8, 20, 64)
CHUNKS = (4, 16, 64)
ARCHS = ("gemma3_text", "mistral")
GEMMA3_LAYERS = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]

tokens_st = st.lists(st.integers(3, 40000), min_size=1, max_size=110)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, smol_tokenizer):
    @functools.cache
    def get(arch: str, window: int) -> str:
        out = str(tmp_path_factory.mktemp(f"{arch}-w{window}"))
        if arch == "gemma3_text":
            return make_tiny_model(arch, out, smol_tokenizer, sliding_window=window, head_dim=16,
                                   query_pre_attn_scalar=24, num_hidden_layers=4, layer_types=GEMMA3_LAYERS,
                                   tie_word_embeddings=True, rope_local_base_freq=500.0)
        return make_tiny_model(arch, out, smol_tokenizer, sliding_window=window, num_hidden_layers=2)

    return get


@pytest.fixture(scope="module")
def engines(model_dirs):
    @functools.cache
    def get(arch: str, window: int, chunk: int, grouped: bool, spec: str = "off", kv: str = "f32") -> Engine:
        extra = {"kv_pool_tokens": 3 * (-(-MAX_CONTEXT // chunk) + 1) * chunk} if grouped else {}
        cfg = EngineConfig(model=model_dirs(arch, window), dtype="float32", max_context=MAX_CONTEXT,
                           kv_chunk=chunk, batch=2, prefill_chunk=13, spec=spec, spec_k=3, kv=kv, **extra)
        engine = Engine(cfg, progress=False)
        assert bool(engine._layout.window_pools) == grouped
        return engine

    return get


def kept(j: int, c: int, window: int, positions: list[int]) -> bool:
    """Chunk j covers part of the window before one of `positions` (a kept window)."""
    return any(j * c < p and (j + 1) * c > p - window + 1 for p in positions)


def within_bound(engine: Engine) -> None:
    """Each windowed group holds exactly the chunks its next token's window reads, at most the
    bound, and the kept windows before checkpoints and prompts' ends besides."""
    c = engine._layout.chunk_size
    for conv in engine._scheduler.cache:
        n = conv.num_cells
        for w in conv.table.windows:
            live = [j for j, i in enumerate(w.chunk_ids) if i is not None and (j + 1) * c > n - w.window + 1]
            assert len(live) <= window_bound(w.window, c), (w.window, w.chunk_ids)
            for j in range(-(-n // c)):
                behind = (j + 1) * c <= n - w.window + 1  # no position of chunk j is read again
                assert (w.chunk_ids[j] is None) == (behind and not kept(j, c, w.window, w.kept)), \
                    (n, w.window, j, w.chunk_ids, w.kept)


def run(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    return run_requests(engine, prompts, GREEDY, within_bound)


def keep_everything(engines, arch: str, window: int, prompts: list[list[int]], kv: str = "f32") -> list[list[int]]:
    ref = engines(arch, window, 64, False, kv=kv)
    ref._scheduler.clear_cache()
    return [run(ref, [p])[0] for p in prompts]


geometry = st.tuples(st.sampled_from(ARCHS), st.sampled_from(WINDOWS), st.sampled_from(CHUNKS))


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(geo=geometry, prompts=st.lists(tokens_st, min_size=1, max_size=3), kv=st.sampled_from(["f32", "int8"]))
def test_batched_lanes_equal_keep_everything(engines, geo, prompts, kv):
    """int8 K/V against int8 K/V keeping every cell (each group's storage is int8 cells)."""
    engine = engines(*geo, True, kv=kv)
    engine._scheduler.clear_cache()
    assert run(engine, prompts) == keep_everything(engines, geo[0], geo[1], prompts, kv)
    assert engine._layout.pool.num_held >= 0 and all(p.num_free for p in engine._layout.window_pools)


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(geo=geometry, first=tokens_st, follow=st.lists(st.integers(3, 40000), min_size=1, max_size=30),
       cut=st.floats(0.0, 1.0), branch=st.lists(st.integers(3, 40000), min_size=1, max_size=20),
       action=st.sampled_from(["stay", "move", "park"]))
def test_follow_ups_and_branches_equal_keep_everything(engines, geo, first, follow, cut, branch, action):
    """A follow-up extends the conversation (its windows at the end are kept: it prefills only
    the new tokens); a branch from an earlier turn recomputes where the windows before it are gone."""
    engine = engines(*geo, True)
    engine._scheduler.clear_cache()
    (out,) = run(engine, [first])
    if action != "stay":
        move_or_park(engine, action)
    cached = engine._scheduler.counters.num_cached_tokens
    second = first + out + follow
    (b,) = run(engine, [second])
    assert engine._scheduler.counters.num_cached_tokens - cached == len(first) + len(out) - 1  # the last token is fed next
    cached = engine._scheduler.counters.num_cached_tokens
    assert run(engine, [second]) == [b]  # a regenerate: the window before the prompt's end was kept
    assert engine._scheduler.counters.num_cached_tokens - cached == len(second) - 1
    third = second[: max(1, int(len(second) * cut))] + branch
    (c,) = run(engine, [third])
    assert [b, c] == keep_everything(engines, geo[0], geo[1], [second, third])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(geo=geometry, prompts=st.lists(tokens_st, min_size=1, max_size=2), wrong_every=st.sampled_from([2, 3]))
def test_drafts_and_their_rollback_equal_keep_everything(engines, geo, prompts, wrong_every):
    """Rejected drafts never released a chunk: only committed cells move a window."""
    want = keep_everything(engines, geo[0], geo[1], prompts)
    engine = engines(*geo, True, spec="ngram")
    engine._scheduler.clear_cache()
    oracle = OracleDrafter(wrong_every)
    oracle.reference = [p + out for p, out in zip(prompts, want)]
    engine._scheduler.drafts.drafter = oracle
    before = engine._scheduler.drafts.counters.num_accepted
    assert run(engine, prompts) == want
    assert engine._scheduler.drafts.counters.num_accepted > before

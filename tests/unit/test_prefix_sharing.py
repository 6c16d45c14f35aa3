"""Identical prefixes: found in O(prompt) whatever the number of cached conversations, held once.

No model: the scheduler is driven by hand (as in test_scheduler.py). N conversations that
share one system prompt of S tokens hold the full chunks of S once and their own parts
besides (exact chunk counts, with the system prompt ending on and inside chunk borders,
the first conversation parked or still running); the stats the server shows (shared
chunks, cells saved) match; and a lookup reads the same number of tree edges with 10 or
1000 parked conversations.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import strata.engine.cache as cache_module
import strata.engine.prefix_index as prefix_index
from strata.engine.cache import ConversationCache
from strata.engine.conversation import Conversation
from strata.engine.scheduler import Scheduler
from strata.kv.layout import PooledLayout
from strata.kv.table import ChunkTable, chunks_for
from strata.step import Sampled, StepOutput
from tests.checks import check_cache, check_scheduler, scan_longest_prefix

CHUNK = 4


def system_prompt(n: int) -> list[int]:
    return [100 + (i * 7) % 13 for i in range(n)]


def step(s: Scheduler, token: int = 7) -> None:
    plan = s.schedule()
    check_scheduler(s)
    s.commit(plan, StepOutput(tuple(Sampled(w.request_id, token, None) for w in plan.work if w.do_sample)))
    check_scheduler(s)


def prefill(s: Scheduler, request_id: str, prompt: list[int]) -> None:
    """Admit `prompt` and step until its first token is sampled."""
    s.add(request_id, prompt)
    step(s)
    while s.seqs[request_id].is_prefilling:
        step(s)


@pytest.mark.parametrize("concurrent", [False, True], ids=["parked", "running"])
@pytest.mark.parametrize("system_len", [8, 10, 3], ids=["on-border", "inside", "under-a-chunk"])
@pytest.mark.parametrize("n", [1, 4, 16])
def test_n_conversations_hold_the_system_prompt_once(n, system_len, concurrent):
    s = Scheduler(PooledLayout(200, CHUNK), n, max_context=64, prefill_chunk=64)
    system = system_prompt(system_len)
    for i in range(n):
        own = [1 + i, 50, 51][: 1 + i % 3]  # distinct first tokens: each shares exactly the system prompt
        prefill(s, f"r{i}", system + own)
        if i and s.seqs[f"r{i}"].num_cached != system_len:
            pytest.fail(f"request {i} reused {s.seqs[f'r{i}'].num_cached} tokens, not the {system_len} shared")
        if not concurrent:
            s.finish(f"r{i}")
    for request_id in list(s.seqs):
        s.finish(request_id)
    check_scheduler(s)
    convs = list(s.cache)
    assert len(convs) == n and all(c.token_ids[:system_len] == system for c in convs)
    full = system_len // CHUNK  # the full chunks of the system prompt: held once
    own = sum(chunks_for(c.num_cells, CHUNK) - full for c in convs)  # the rest: each its own
    assert s.layout.pool.num_held == full + own
    assert sum(len(c.table.chunk_ids) for c in convs) == full * n + own  # without sharing
    assert len({tuple(c.table.chunk_ids[:full]) for c in convs}) == 1  # the very same ids
    stats = s.stats()
    assert stats.num_chunks_shared == (full if n > 1 else 0)
    assert stats.num_cells_saved == (n - 1) * full * CHUNK
    assert sum(stats.shared_chunks_per_lane) == (full * n if n > 1 else 0)
    for i in range(full):
        assert s.layout.pool.refcount(convs[0].table.chunk_ids[i]) == n
    s.clear_cache()
    assert s.layout.pool.num_free == s.layout.pool.num_total


def test_eviction_frees_a_shared_chunk_only_with_its_last_holder():
    s = Scheduler(PooledLayout(200, CHUNK), 3, max_context=64, prefill_chunk=64)
    system = system_prompt(8)
    for i in range(3):
        prefill(s, f"r{i}", system + [1 + i])
        s.finish(f"r{i}")
    shared = s.lanes[0].conv.table.chunk_ids[:2]
    held = s.layout.pool.num_held
    for k, conv in enumerate(s.cache.idle_lru()):
        s.lanes.evict((conv,))
        check_scheduler(s)
        assert all(s.layout.pool.refcount(i) == 2 - k for i in shared)
        assert s.layout.pool.num_held == held - 1 - (2 if k == 2 else 0)
        held = s.layout.pool.num_held


def test_lookup_cost_does_not_grow_with_parked_conversations(monkeypatch):
    """A lookup compares one edge per tree node on the prompt's path: 10 or 1000 parked
    conversations sharing a system prompt cost the same number of edge compares."""
    calls = []
    real = prefix_index.common_prefix_len
    counted = lambda a, b: calls.append(1) or real(a, b)  # noqa: E731
    monkeypatch.setattr(prefix_index, "common_prefix_len", counted)
    monkeypatch.setattr(cache_module, "common_prefix_len", counted)  # (the scan it replaced used this one)
    system = system_prompt(300)
    for num_parked in (10, 1000):
        cache = ConversationCache()
        for i in range(num_parked):
            cache.add(Conversation(cache.new_id(), ChunkTable(), system + [i, i + 1, i + 2] * 20))
        calls.clear()
        prompt = system + [5, 6, 7] * 20 + [9]
        best, n = cache.longest_prefix(prompt)
        assert best.token_ids == prompt[:-1] and n == 360  # the sixth conversation
        assert len(calls) <= 3, f"{len(calls)} edge compares with {num_parked} parked conversations"


def test_ties_go_to_idle_then_most_recent():
    cache = ConversationCache()
    a, b, c = (Conversation(cache.new_id(), ChunkTable(), [1, 2, 3, 4]) for _ in range(3))
    for conv in (a, b, c):
        cache.add(conv)
    assert cache.longest_prefix([1, 2, 9]) == (c, 2)
    cache.touch(a)
    assert cache.longest_prefix([1, 2, 3, 4, 5]) == (a, 4)
    cache.activate(a)
    assert cache.longest_prefix([1, 2]) == (c, 2)  # idle beats active
    cache.activate(b)
    cache.activate(c)
    assert cache.longest_prefix([1, 2]) == (c, 2)  # all active: the most recent
    cache.deactivate(a)
    assert cache.longest_prefix([1]) == (a, 1)
    cache.cut(a, 1)
    assert cache.longest_prefix([1, 2]) == (c, 2)  # a no longer reaches token 2
    cache.append(a, [2, 3, 4, 5])
    assert cache.longest_prefix([1, 2, 3, 4, 5]) == (a, 5)
    cache.remove(a)
    assert cache.longest_prefix([1, 2, 3, 4, 5]) == (c, 4)
    assert cache.longest_prefix([7]) == (None, 0)
    for p in ([1], [1, 2, 3, 4, 5], [2]):
        assert cache.longest_prefix(p) == scan_longest_prefix(cache, p)
    check_cache(cache)


def test_a_stale_index_fails_the_check():
    """`Scheduler.check` catches tokens changed behind the cache's back."""
    cache = ConversationCache()
    conv = Conversation(cache.new_id(), ChunkTable(), [1, 2, 3])
    cache.add(conv)
    check_cache(cache)
    conv.token_ids.append(4)  # not through cache.append
    with pytest.raises(AssertionError):
        check_cache(cache)


def test_metrics_and_slots_show_shared_chunks():
    """/metrics exports the shared chunks and the cells they save; /slots each lane's shared chunks."""
    import dataclasses

    from strata.server.metrics import ServerMetrics
    from strata.engine.snapshot import EngineSnapshot, LaneView

    s = Scheduler(PooledLayout(200, CHUNK), 3, max_context=64, prefill_chunk=64)
    system = system_prompt(9)  # two full chunks and one cell
    for i in range(3):
        prefill(s, f"r{i}", system + [1 + i])
        s.finish(f"r{i}")
    stats = s.stats()
    assert (stats.num_chunks_shared, stats.num_cells_saved) == (2, 2 * 2 * CHUNK)
    assert stats.shared_chunks_per_lane == (2, 2, 2)
    lanes = tuple(LaneView(i, "idle", 10, 3, None, None, None, stats.shared_chunks_per_lane[i]) for i in range(3))
    snap = EngineSnapshot(stats, dataclasses.replace(s.counters), 0, 0, 0, lanes, 1, 64, 100)
    metrics = ServerMetrics()
    metrics.add_pool(lambda: snap)
    text = metrics.render().decode()
    assert "strata_kv_chunks_shared 2.0" in text
    assert f"strata_kv_cells_saved {2 * 2 * CHUNK}.0" in text


class CacheMachine(RuleBasedStateMachine):
    """The cache alone under random changes (duplicates, idle extensions, cuts to any length):
    after each, the index agrees with a brute-force scan (`ConversationCache.check`)."""

    def __init__(self):
        super().__init__()
        self.cache = ConversationCache()

    def convs(self, data, active=None):
        convs = sorted((c for c in self.cache if active is None or c.is_active == active), key=lambda c: c.conv_id)
        return data.draw(st.sampled_from(convs)) if convs else None

    @rule(tokens=st.lists(st.integers(1, 3), max_size=10))
    def add(self, tokens):
        self.cache.add(Conversation(self.cache.new_id(), ChunkTable(), tokens))

    @rule(data=st.data())
    def remove(self, data):
        if (conv := self.convs(data)) is not None:
            self.cache.remove(conv)

    @rule(data=st.data(), tokens=st.lists(st.integers(1, 3), min_size=1, max_size=4))
    def extend(self, data, tokens):
        if (conv := self.convs(data)) is not None:
            self.cache.append(conv, tokens)

    @rule(data=st.data())
    def cut(self, data):
        if (conv := self.convs(data)) is not None:
            self.cache.cut(conv, data.draw(st.integers(0, len(conv.token_ids))))

    @rule(data=st.data())
    def touch(self, data):
        if (conv := self.convs(data)) is not None:
            self.cache.touch(conv)

    @rule(data=st.data())
    def activate(self, data):
        if (conv := self.convs(data, active=False)) is not None:
            self.cache.activate(conv)

    @rule(data=st.data())
    def deactivate(self, data):
        if (conv := self.convs(data, active=True)) is not None:
            self.cache.deactivate(conv)

    @rule(prompt=st.lists(st.integers(1, 3), max_size=12))
    def lookup(self, prompt):
        assert self.cache.longest_prefix(prompt) == scan_longest_prefix(self.cache, prompt)

    @invariant()
    def agrees_with_a_scan(self):
        check_cache(self.cache)


TestCache = CacheMachine.TestCase
TestCache.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)


@pytest.mark.parametrize("system_len", [8, 10])
def test_prompts_admitted_together_hold_their_prefix_once(system_len):
    """Admitted in the same step, neither can fork the other: both compute the system
    prompt, and the commit makes the second adopt the first's full chunks (its own freed)."""
    s = Scheduler(PooledLayout(200, CHUNK), 3, max_context=64, prefill_chunk=64)
    system = system_prompt(system_len)
    for i in range(3):
        s.add(f"r{i}", system + [1 + i, 9])
    step(s)
    assert all(seq.num_cached == 0 and not seq.is_prefilling for seq in s.seqs.values())
    full = system_len // CHUNK
    assert s.counters.num_chunks_adopted == 2 * full
    own = sum(len(seq.conv.table.chunk_ids) - full for seq in s.seqs.values())
    assert s.layout.pool.num_held == full + own
    assert len({tuple(seq.conv.table.chunk_ids[:full]) for seq in s.seqs.values()}) == 1
    assert s.stats().num_cells_saved == 2 * full * CHUNK
    for _ in range(3):
        step(s)
    for request_id in list(s.seqs):
        s.finish(request_id)
    check_scheduler(s)
    s.clear_cache()
    assert s.layout.pool.num_free == s.layout.pool.num_total


def test_pool_full_order_counts_a_shared_chunk_once():
    """Parked conversations sharing a system prompt's chunks: evicting one of them frees only
    its own chunks, so the pool takes as many as the need covers, least recently used first."""
    s = Scheduler(PooledLayout(10, CHUNK), 4, max_context=40, prefill_chunk=64)
    system = system_prompt(8)
    for i in range(3):
        prefill(s, f"r{i}", system + [1 + i])
        s.finish(f"r{i}")
    first, second, third = s.cache.idle_lru()
    assert s.layout.pool.num_held == 2 + 3 and s.stats().num_chunks_shared == 2
    s.add("big", [7] * 27)  # 28 cells: 7 chunks, 5 free; the oldest frees 1, the two oldest 2
    plan = s.schedule()
    check_scheduler(s)
    assert [a.request_id for a in plan.admitted] == ["big"] and s.counters.num_evictions == 2
    assert s.cache.get(first.conv_id) is None and s.cache.get(second.conv_id) is None
    assert s.cache.get(third.conv_id) is third
    assert all(s.layout.pool.refcount(i) == 1 for i in third.table.chunk_ids)
    assert s.stats().num_chunks_shared == 0 and s.layout.pool.num_free == 0

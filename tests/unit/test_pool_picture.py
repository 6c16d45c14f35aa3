"""The monitor's picture of the pool and the events found between pictures, on a scheduler
driven by hand (no model): exact chunk ids, owners, fills, lane states and LRU order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler import Driver, pooled
from tests.unit.test_window_groups import apply_op

from strata.engine.scheduler import Scheduler
from strata.kv.reserve import ReservedLayout
from strata.engine.picture import ACTIVE, FREE, KEPT, PARKED, RESERVED, take_picture
from strata.kv.layout import PooledLayout
from strata.server.monitor.watch import PoolWatch, diff_events


def picture(s: Scheduler, step: int = 1):
    return take_picture(s, s.max_context, step)


def test_chunks_lanes_and_parked_conversations_in_lru_order():
    s = Scheduler(pooled(8, 4), num_lanes=2, max_context=32, prefill_chunk=3)
    d = Driver(s)
    s.add("a", list(range(1, 7)))  # 6 tokens: room for 7 cells = chunks 0, 1
    d.step()  # reads 3 of them
    p = picture(s)
    assert p.lanes[0].state == "prefill" and p.lanes[0].num_cells == 3 and p.lanes[0].num_prompt_tokens == 6
    assert p.chunk_owner[:3] == (1, 1, 0) and p.chunk_state[:3] == (ACTIVE, ACTIVE, FREE)
    assert p.chunk_filled[:2] == (3, 0)  # both chunks are held from admission; cells fill as the prompt is read
    d.step()
    p = picture(s)
    assert p.lanes[0].state == "decode" and p.chunk_filled[:2] == (4, 2)
    d.step(finish=("a",))
    s.add("b", [50, 51, 52])
    d.step(finish=("b",))
    p = picture(s)
    assert [lane.state for lane in p.lanes] == ["idle", "idle"]
    # b's chunk starts a new run halfway into the free ids 2..7 (room for both tables to grow)
    assert p.chunk_state[:5] == (PARKED, PARKED, FREE, FREE, PARKED) and p.chunk_owner[:5] == (1, 1, 0, 0, 2)
    assert [c.conv_id for c in p.parked] == [1, 2]  # least recently used first
    assert (p.num_chunks, p.num_chunks_free, p.pooled, p.chunk_size) == (8, 5, True, 4)


def test_a_shared_prefix_is_one_chunk_with_two_holders():
    s = Scheduler(pooled(8, 4), num_lanes=2, max_context=32, prefill_chunk=16)
    d = Driver(s)
    s.add("a", list(range(1, 10)))
    d.step(finish=("a",))
    s.add("b", list(range(1, 5)) + [99, 98])  # its first full chunk is a's chunk 0
    d.step()
    p = picture(s)
    assert p.chunk_holders[0] == 2 and p.chunk_owner[0] == 1  # the oldest holder names it
    assert p.chunk_state[0] == ACTIVE  # one of its holders is running
    assert sum(1 for h in p.chunk_holders if h > 1) == 1


def test_reserved_lanes_show_their_whole_reservation():
    s = Scheduler(ReservedLayout(2, 16, 4), num_lanes=2, max_context=16, prefill_chunk=16)
    d = Driver(s)
    s.add("a", [1, 2, 3, 4, 5])
    d.step()
    p = picture(s)
    assert not p.pooled and p.num_chunks == 8 and p.num_chunks_free == 0
    assert p.chunk_state[:4] == (ACTIVE, ACTIVE, RESERVED, RESERVED)  # 5 cells written of lane 0's 16
    assert p.chunk_owner[:4] == (1, 1, 0, 0) and p.chunk_state[4:] == (RESERVED,) * 4


def test_events_name_the_evicted_conversations_and_count_refusals():
    s = Scheduler(pooled(4, 4), num_lanes=2, max_context=16, prefill_chunk=16)
    d = Driver(s)
    watch = PoolWatch()
    watch.observe(lambda n: take_picture(s, s.max_context, n))
    assert watch.picture is None  # nobody watches: no picture is taken
    watch.watchers = 1
    watch.observe(lambda n: take_picture(s, s.max_context, n))
    s.add("a", [1, 2, 3, 4, 5, 6])  # 2 chunks
    d.step(finish=("a",))
    s.add("b", [7, 8, 9, 10, 11])  # 2 chunks
    d.step(finish=("b",))
    watch.observe(lambda n: take_picture(s, s.max_context, n))
    assert watch.events == ()
    s.add("c", [20, 21, 22, 23, 24, 25, 26])  # 2 chunks: conversation 1, the least recent, gives way
    d.step()
    watch.observe(lambda n: take_picture(s, s.max_context, n))
    assert [(e.kind, e.count, e.conv_ids) for e in watch.events] == [("eviction", 1, (1,))]
    s.add("d", list(range(30, 45)))  # 4 chunks: more than the pool can free while c runs
    d.step()
    watch.observe(lambda n: take_picture(s, s.max_context, n))
    assert [(e.kind, e.count) for e in watch.events[1:]] == [("refusal", 1)]
    assert [e.seq for e in watch.events] == [1, 2]
    assert watch.picture.num_refusals == 1 and watch.picture.num_evictions == 1


def test_a_truncation_names_the_lane_conversation_it_ended():
    s = Scheduler(pooled(3, 4), num_lanes=2, max_context=32, prefill_chunk=16)
    d = Driver(s)
    s.add("a", [1, 2, 3])  # 1 chunk, grows into a second at its 5th cell
    s.add("b", [4, 5, 6])
    d.step()
    before = picture(s, 1)
    for _ in range(4):
        d.step()
    after = picture(s, 2)
    assert after.num_truncations == 1
    assert diff_events(before, after) == [("truncation", 1, (2,))]  # the youngest, b, ended


GROUPS = (((1,), 100), ((0, 2, 3), 300))  # (layers, K/V bytes per cell): the full group, then window 8's


def test_each_windowed_group_is_its_own_chunk_map_with_kept_windows():
    s = Scheduler(PooledLayout(32, 4, [(8, 12)]), num_lanes=2, max_context=64, prefill_chunk=32)
    d = Driver(s)
    s.add("a", list(range(1, 11)))  # its prompt's end (9) keeps the window 2..8: chunks 0, 1, 2
    for _ in range(21):
        d.step()
    s.finish("a")  # 30 cells: the next token (30) reads 23..29, chunks 5, 6, 7 (its cell 30 is in 7)
    p = take_picture(s, s.max_context, 1, GROUPS)
    assert (p.full_layers, p.full_bytes_per_cell) == ((1,), 100)
    assert p.chunk_state[:8] == (PARKED,) * 8 and p.chunk_owner[:9] == (1,) * 8 + (0,)  # the full group keeps all
    (g,) = p.groups
    assert (g.window, g.layers, g.bytes_per_cell, g.num_chunks, g.num_chunks_free, g.num_chunks_kept) == (
        8, (0, 2, 3), 300, 12, 6, 3)
    assert g.chunk_state[:8] == (KEPT, KEPT, KEPT, FREE, FREE, PARKED, PARKED, PARKED)
    assert g.chunk_owner[:8] == (1, 1, 1, 0, 0, 1, 1, 1) and g.chunk_filled[:8] == (4, 4, 4, 0, 0, 4, 4, 2)
    assert g.chunk_state.count(FREE) == g.num_chunks_free and len(g.chunk_owner) == 12
    assert p.parked[0].window_chunks == (6,) and p.lanes[0].window_chunks == (6,)
    assert p.lanes[1].window_chunks == (0,)

    tokens = list(s.lanes[0].conv.token_ids)
    s.add("b", tokens[:10] + [77])  # a regenerate of the first turn: it branches at 10
    d.step()  # b writes 77 at 10: its next token (11) reads 4..10, chunks 1 and its copy of 2
    g = take_picture(s, s.max_context, 2, GROUPS).groups[0]
    assert g.chunk_holders[:3] == (2, 2, 1)  # the full chunks 0, 1 are shared; the partial 2 was copied
    assert g.chunk_state[:3] == (KEPT, ACTIVE, KEPT)  # 0: a kept window of both; 1: read by running b
    copy = next(i for i in range(8, 12) if g.chunk_owner[i] == 2)
    assert g.chunk_state[copy] == ACTIVE and g.chunk_filled[copy] == 3  # cells 8, 9 and 77 at 10
    stats = s.stats().groups[0]
    assert stats.num_chunks_kept == g.num_chunks_kept == g.chunk_state.count(KEPT)


def test_a_model_without_windows_has_no_group_rows():
    s = Scheduler(pooled(8, 4), num_lanes=1, max_context=32, prefill_chunk=8)
    d = Driver(s)
    s.add("a", [1, 2, 3])
    d.step()
    p = picture(s)
    assert p.groups == () and p.full_layers == () and p.lanes[0].window_chunks == ()


SEEN: list[tuple[int, int]] = []  # per example: the most KEPT and the most shared windowed chunks a picture drew


@settings(max_examples=40, deadline=None)
@given(window=st.sampled_from([3, 8, 13]), chunk=st.sampled_from([2, 4]),
       ops=st.lists(st.tuples(st.sampled_from(["new", "follow", "branch", "step", "finish"]),
                              st.integers(0, 9), st.integers(1, 20)), min_size=4, max_size=30))
def test_any_traffic_draws_each_group_as_its_pool_holds_it(window, chunk, ops):
    """Each windowed group's map agrees with its pool after every step: holders are the pool's
    refcounts, free cells its free list; a chunk a holder's next token reads is never KEPT, and
    the KEPT ones are those /slots and /metrics count (PoolStats)."""
    from strata.kv.groups import window_pool_chunks
    from strata.kv.window_table import needed_from

    lanes, max_context, piece = 2, 48, 6
    layout = PooledLayout(lanes * (max_context // chunk + 1), chunk,
                          [(window, window_pool_chunks(window, chunk, lanes, piece, 1))])
    s = Scheduler(layout, num_lanes=lanes, max_context=max_context, prefill_chunk=piece)
    d, rid, seen = Driver(s), 0, (0, 0)
    for op, a, n in ops:
        rid = apply_op(s, op, a, n, rid, max_context)
        d.step()
        (g,) = take_picture(s, s.max_context, 1, GROUPS).groups
        pool = layout.window_pools[0]
        assert g.num_chunks == len(g.chunk_state) == pool.num_total
        assert g.chunk_state.count(FREE) == g.num_chunks_free == pool.num_free
        assert list(g.chunk_holders) == [pool.refcount(i) for i in range(pool.num_total)]
        assert all((owner != 0) == (pool.refcount(i) > 0) for i, owner in enumerate(g.chunk_owner))
        for conv in s.cache:
            w = conv.table.windows[0]
            first = needed_from(conv.num_cells, window, chunk)
            assert all(g.chunk_state[i] != KEPT for j, i in enumerate(w.chunk_ids) if i is not None and j >= first)
        assert s.stats().groups[0].num_chunks_kept == g.num_chunks_kept == g.chunk_state.count(KEPT)
        seen = (max(seen[0], g.num_chunks_kept), max(seen[1], sum(1 for h in g.chunk_holders if h > 1)))
    SEEN.append(seen)


def test_the_traffic_drew_kept_and_shared_windowed_chunks():
    """The property above is not vacuous: its pictures drew kept and shared windowed chunks."""
    SEEN.clear()
    test_any_traffic_draws_each_group_as_its_pool_holds_it()
    assert max(k for k, _ in SEEN) > 0 and max(n for _, n in SEEN) > 0

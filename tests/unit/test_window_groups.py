"""Layer groups without a model: exact chunk ids of windowed groups (kv/groups.py, kv/window_table.py).

A windowed group's table releases a chunk at the commit whose cells pass it (the window of
the next token no longer reads it), holds at most ceil(window / chunk) + 1 chunks while
decoding, shares full chunks with forks and identical conversations (refcounts per group),
and a follow-up or a branch reuses a prefix only where every group still holds its window.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from strata.engine.scheduler import Scheduler
from strata.kv import window_table as wt
from strata.kv.groups import LayerGroup, describe_groups, layer_groups, window_bound
from strata.kv.layout import PooledLayout
from strata.kv.table import CellCopy
from tests.unit.test_scheduler import Driver


def windowed(num_chunks=32, window=8, window_chunks=12, chunk_size=4) -> PooledLayout:
    return PooledLayout(num_chunks, chunk_size, [(window, window_chunks)])


def wids(s: Scheduler, lane: int = 0) -> list[int | None]:
    return list(s.lanes[lane].conv.table.windows[0].chunk_ids)


def test_groups_come_from_the_layers_windows():
    assert layer_groups((), 3) == (LayerGroup(None, (0, 1, 2)),)
    assert layer_groups((8, None, 8, 8, 16), 5) == (LayerGroup(None, (1,)), LayerGroup(8, (0, 2, 3)),
                                                    LayerGroup(16, (4,)))
    assert layer_groups((4096, 4096), 2) == (LayerGroup(None, ()), LayerGroup(4096, (0, 1)))  # Mistral-style
    assert window_bound(512, 4096) == 2 and window_bound(512, 256) == 3 and window_bound(8, 4) == 3


def test_a_model_without_windows_keeps_one_group_and_its_ids():
    layout = PooledLayout(8, 4)
    assert layout.window_pools == () and layout.new_table(0).windows == []


def test_decoding_releases_each_chunk_at_the_step_its_window_passes_it():
    s = Scheduler(windowed(), num_lanes=1, max_context=64, prefill_chunk=8)
    d = Driver(s)
    s.add("a", list(range(1, 11)))
    p = d.step()  # 8 prompt cells: the group grows for the piece only, the full group for the prompt
    assert p.work[0].chunk_ids == (0, 1, 2) and p.work[0].window_ids == ((0, 1),)
    s.layout.drop_kept_windows(s.lanes[0].conv.table)  # (the prompt's end keeps its window: below)
    assert wids(s) == [0, 1]  # next token at 8 reads 1..8: chunk 0 is still read
    p = d.step()  # the rest of the prompt: cells 8, 9
    assert p.work[0].window_ids == ((0, 1, 2),)
    assert wids(s) == [0, 1, 2]  # next token at 10 reads 3..10: cell 3 keeps chunk 0
    pool = s.layout.window_pools[0]
    held = []
    for n in range(10, 30):  # decode: the token at n is written, then the window moves to n + 1
        p = d.step()
        assert p.work[0].start == n
        ids = wids(s)
        held.append(len([i for i in ids if i is not None]))
        first = max(0, n + 1 - 8 + 1) // 4
        assert all(i is None for i in ids[:first]) and all(i is not None for i in ids[first:])
        assert pool.num_held == held[-1]  # released ids are on the free list at once
    assert max(held) <= window_bound(8, 4) == 3
    assert wids(s) == [None] * 5 + [5, 6, 7]
    s.finish("a")
    assert wids(s) == [None] * 5 + [5, 6, 7] and s.layout.pool.num_held == 8  # an idle one keeps its window


def test_the_window_before_a_prompts_end_and_a_turn_start_is_kept():
    s = Scheduler(windowed(), num_lanes=1, max_context=64, prefill_chunk=32)
    d = Driver(s)
    s.add("a", list(range(1, 11)))  # its end (9) reads 2..8: chunks 0, 1, 2 are kept
    for _ in range(21):
        d.step()
    s.finish("a")
    conv = s.lanes[0].conv
    assert conv.num_cells == 30 and wids(s) == [0, 1, 2, None, None, 5, 6, 7]
    assert conv.table.windows[0].kept == [9]
    tokens = list(conv.token_ids)
    s.add("b", tokens + [2000, 5, 6])  # a follow-up at 30: its start (30) and its end (32) are kept
    d.step()
    assert conv.table.windows[0].kept == [9, 30, 32]
    s.abort("b")  # back to 30 cells, the follow-up's windows with it
    assert conv.table.windows[0].kept == [9, 30] and conv.num_cells == 30
    s.add("c", tokens[:10] + [77])  # a regenerate of the first turn: 10 cells reused, none recomputed
    p = d.step()
    assert p.admitted[0].num_cached == 10 and p.work[0].start == 10


def test_kept_windows_give_way_before_any_conversation():
    s = Scheduler(windowed(window_chunks=9), num_lanes=2, max_context=64, prefill_chunk=32)
    d = Driver(s)
    s.add("a", list(range(1, 11)))
    for _ in range(21):
        d.step()
    s.finish("a")
    assert wids(s, 0) == [0, 1, 2, None, None, 5, 6, 7]  # 6 of 9 held, 3 of them kept
    s.add("b", list(range(100, 120)))  # 5 windowed chunks for its 20-cell piece: 3 are free
    p = d.step()
    a = next(c for c in s.cache if c.token_ids[0] == 1)
    assert a.table.windows[0].kept == [] and list(a.table.windows[0].chunk_ids) == [None] * 5 + [5, 6, 7]
    assert s.counters.num_evictions == 0  # the kept window went; the conversation stayed
    assert p.work[0].window_ids == ((0, 1, 2, 3, 4),)
    s.abort("b")
    s.add("c", list(range(200, 230)))  # 8 chunks: 6 free even without a's kept window: a gives way
    d.step()
    assert s.counters.num_evictions == 1 and all(c.token_ids[0] != 1 for c in s.cache)


def test_the_longest_reusable_prefix_skips_released_windows():
    layout = windowed()
    t = layout.new_table(0)
    layout.grow(t, 30)
    layout.grow_windows(t, 30)
    t.append_cells(30)  # next token at 30 reads 23..29: chunks 5..7 held
    assert t.windows[0].chunk_ids == [None] * 5 + [5, 6, 7]
    assert layout.reusable(t, 30) == 30 and layout.reusable(t, 27) == 27
    assert layout.reusable(t, 26) == 0  # 26 reads 19..25: chunk 4 is gone
    assert not layout.windows_held(t, 26) and layout.windows_held(t, 27)


@settings(max_examples=60, deadline=None)
@given(window=st.integers(1, 40), chunk=st.sampled_from([1, 3, 4, 8, 16]),
       pieces=st.lists(st.integers(1, 20), min_size=1, max_size=30))
def test_a_windowed_table_never_exceeds_its_bound(window, chunk, pieces):
    """Any sequence of steps: after each commit the table holds exactly the chunks its next
    token's window reads, never more than lane_window_chunks during a step, never more than
    the bound once a step of one cell commits."""
    layout = PooledLayout(4096, chunk, [(window, 4096)])
    t = layout.new_table(0)
    pool = layout.window_pools[0]
    for n in pieces:
        layout.grow(t, t.num_cells + n)
        layout.grow_windows(t, t.num_cells + n)
        t.append_cells(n)
        w = t.windows[0]
        first = max(0, t.num_cells - window + 1) // chunk
        assert [i is None for i in w.chunk_ids] == [j < first for j in range(len(w.chunk_ids))]
        assert len(w.held) <= window_bound(window, chunk) + (-(-(n - 1) // chunk))
        assert pool.num_held == len(w.held)
        pool.check()
    t.append_cells(0)
    wt.release(t.windows[0])
    assert pool.num_held == 0


def test_pool_stats_count_each_windowed_group():
    s = Scheduler(windowed(), num_lanes=2, max_context=64, prefill_chunk=32)
    d = Driver(s)
    s.add("a", list(range(1, 23)))
    d.step()
    (g,) = s.stats().groups
    assert (g.window, g.num_chunks_total, g.num_chunks_held, g.num_chunks_free) == (8, 12, 3, 9)
    assert g.chunks_per_lane == (3, 0)  # 22 cells: 22 reads 15.., the prompt's end (21) 14..: chunks 3..5
    assert s.stats().num_chunks_held == 6  # the full group: the prompt and one token (23 cells)


TRAFFIC: list[tuple[int, int, int]] = []  # per example: chunks passed, evictions, cached tokens


def apply_op(s: Scheduler, op: str, a: int, n: int, rid: int, max_context: int) -> int:
    """One drawn traffic op on `s` (new, follow, branch, finish, abort, park; step: nothing
    here), then every sequence about to pass the context finished; returns the last request id."""
    held = list(s.cache)
    if op in ("follow", "branch") and held:
        conv = held[a % len(held)]
        cut = conv.num_cells if op == "follow" else max(1, conv.num_cells * a // 10)
        prompt = conv.token_ids[:cut] + list(range(5000 + rid, 5000 + rid + n))
    else:
        prompt = list(range(100 * a, 100 * a + n))
    if op in ("new", "follow", "branch") and len(prompt) + 4 < max_context:
        rid += 1
        s.add(f"r{rid}", prompt)
    elif op == "finish" and s.seqs:
        s.finish(sorted(s.seqs)[a % len(s.seqs)])
    elif op == "abort" and s.seqs:
        s.abort(sorted(s.seqs)[a % len(s.seqs)])
    elif op == "park":
        idle = [ln.index for ln in s.lanes if ln.is_idle]
        if idle:
            s.park(idle[a % len(idle)])
    for seq in list(s.seqs.values()):  # nothing runs past the context
        if seq.conv.num_cells + 2 >= max_context:
            s.finish(seq.request_id)
    return rid


@settings(max_examples=40, deadline=None)
@given(window=st.sampled_from([3, 8, 13]), chunk=st.sampled_from([2, 4, 8]), keep=st.integers(0, 2),
       ops=st.lists(st.tuples(st.sampled_from(["new", "follow", "branch", "step", "finish", "abort", "park"]),
                              st.integers(0, 9), st.integers(1, 30)), min_size=5, max_size=40))
def test_any_traffic_keeps_every_groups_invariants(window, chunk, keep, ops):
    """Follow-ups, branches, aborts and parks through pools sized as build.py sizes them, the
    windowed ones with room for few idle windows: every step's invariants hold (refcounts per
    group, windows held, nothing passed kept), and no lane is ever short of windowed room."""
    from strata.kv.groups import window_pool_chunks

    lanes, max_context, piece = 3, 64, 6
    layout = PooledLayout(lanes * (max_context // chunk + 1), chunk,
                          [(window, window_pool_chunks(window, chunk, lanes, piece, keep))])
    s = Scheduler(layout, num_lanes=lanes, max_context=max_context, prefill_chunk=piece)
    d = Driver(s)
    rid = passed = 0
    for op, a, n in ops:
        rid = apply_op(s, op, a, n, rid, max_context)
        d.step()
        passed += sum(1 for c in s.cache for i in c.table.windows[0].chunk_ids if i is None)
    for request_id in list(s.seqs):
        s.finish(request_id)
    s.clear_cache()
    TRAFFIC.append((passed, s.counters.num_evictions, s.counters.num_cached_tokens))
    assert layout.pool.num_held == 0 and all(p.num_held == 0 for p in layout.window_pools)


def test_the_traffic_passed_windows_evicted_and_reused():
    """The property above is not vacuous: its examples released chunks, evicted and reused."""
    TRAFFIC.clear()
    test_any_traffic_keeps_every_groups_invariants()
    assert max(t[0] for t in TRAFFIC) > 0 and max(t[1] for t in TRAFFIC) > 0 and max(t[2] for t in TRAFFIC) > 0


def test_a_branch_under_pressure_keeps_the_window_it_goes_on_from():
    """The branch's source gives way its other kept windows, never the one the branch reads."""
    s = Scheduler(windowed(window_chunks=7), num_lanes=2, max_context=64, prefill_chunk=32)
    d = Driver(s)
    s.add("a", list(range(1, 11)))
    for _ in range(21):
        d.step()
    s.finish("a")
    conv = s.lanes[0].conv
    s.add("b", list(conv.token_ids) + [2000, 5, 6])  # a follow-up to 33 cells: 30 and 32 are kept too
    d.step(finish=["b"])
    assert wids(s, 0) == [0, 1, 2, None, None, 5, 6, 3, 4] and s.layout.window_pools[0].num_free == 0
    s.add("c", list(conv.token_ids[:10]) + [77])  # a regenerate of the first turn: its window is kept (9)
    p = d.step()
    assert p.admitted[0].num_cached == 10 and s.counters.num_evictions == 0
    assert wids(s, 0) == [0, 1, 2, None, None, None, 6, 3, 4]  # 30's kept window (chunk 5) gave way
    assert conv.table.windows[0].kept == [10]
    assert wids(s, 1) == [0, 1, 5] and CellCopy(2, 5, 0, 2, 1) in p.copies  # into the id 30's window gave back


def test_the_start_line_names_each_groups_layers_chunks_and_bytes():
    groups = layer_groups((512,) * 5 + (None,) + (512,) * 5 + (None,), 12)
    line = describe_groups(groups, [100, 30], 256, [2 * 2048, 10 * 2048])
    assert line == "full: 2 layers (5, 11), 100 chunks, 100.0 MiB; window 512: 10 layers (0-4, 6-10), 30 chunks, 150.0 MiB"
    mistral = layer_groups((64, 64), 2)
    assert describe_groups(mistral, [4, 9], 4, [0, 64]) == (
        "full: 0 layers (none: no K/V), 4 chunks, 0.0 KiB; window 64: 2 layers (0-1), 9 chunks, 2.2 KiB")

"""The scheduler without a model: exact lanes, chunk ids, copies and eviction order.

The scheduler deals in token ids, lanes and chunk ids only (no torch), so every test
here drives it by hand: `schedule()`, then `commit` with a token for each lane that
samples, then `finish` for the requests that are done; `check()` after every step.
"""

from __future__ import annotations

import pytest

from strata.engine.scheduler import Scheduler
from strata.kv.layout import PooledLayout
from strata.kv.reserve import ReservedLayout
from strata.kv.table import CellCopy
from strata.step import Admission, LaneWork, Refusal, Sampled, StepOutput
from tests.checks import check_scheduler


class Driver:
    """Runs steps the way the engine does; sampled tokens are 1000, 1001, ... in work order."""

    def __init__(self, s: Scheduler):
        self.s = s
        self.next_token = 1000
        self.out: dict[str, list[int]] = {}
        self.can_continue: dict[str, bool] = {}

    def step(self, finish=()):
        plan = self.s.schedule()
        check_scheduler(self.s)
        sampled = []
        for w in plan.work:
            if w.do_sample:
                sampled.append(Sampled(w.request_id, self.next_token, None))
                self.out.setdefault(w.request_id, []).append(self.next_token)
                self.next_token += 1
        self.can_continue.update(self.s.commit(plan, StepOutput(tuple(sampled))))
        for request_id in finish:
            self.s.finish(request_id)
        check_scheduler(self.s)
        return plan


def pooled(num_chunks, chunk_size=4):
    return PooledLayout(num_chunks, chunk_size)


def refcounts(s: Scheduler) -> list[int]:
    return [s.layout.pool.refcount(i) for i in range(s.layout.pool.num_total)]


def lane_chunks(s: Scheduler) -> list[list[int] | None]:
    return [None if lane.conv is None else list(lane.conv.table.chunk_ids) for lane in s.lanes]


def tables(s: Scheduler) -> dict[int, tuple]:
    """Every held conversation: (lane, chunk ids, cells, tokens, active)."""
    return {
        c.conv_id: (c.lane, tuple(c.table.chunk_ids), c.num_cells, tuple(c.token_ids), c.is_active)
        for c in s.cache
    }


def R(*ids):
    return tuple(range(*ids))


# ---- admission order and prefill pieces ------------------------------------------------------


def test_prompts_take_the_larger_budget_only_while_no_lane_decodes():
    s = Scheduler(pooled(16), num_lanes=2, max_context=32, prefill_chunk=6, prefill_alone=15)
    d = Driver(s)
    s.add("a", list(range(1, 11)))
    s.add("b", list(range(11, 22)))
    p = d.step()  # nothing decodes yet: 15 prompt tokens, a whole then the start of b
    assert p.work == (LaneWork(0, "a", R(1, 11), 0, (0, 1, 2), True, prompt=True),
                      LaneWork(1, "b", R(11, 16), 0, (8, 9, 10), False, prompt=True))
    p = d.step()  # a decodes now: back to pieces of 6, so its gap stays one small step
    assert p.work == (LaneWork(0, "a", (1000,), 10, (0, 1, 2), True),
                      LaneWork(1, "b", R(16, 22), 5, (8, 9, 10), True, prompt=True))
    s.finish("a")
    s.finish("b")
    s.add("c", list(range(40, 60)))
    p = d.step()  # alone again: 15 of its 20 tokens
    assert [(w.request_id, len(w.token_ids)) for w in p.work] == [("c", 15)]


@pytest.mark.parametrize("kind", ["pooled", "reserved"])
def test_admission_order_and_prefill_pieces(kind):
    layout = pooled(16) if kind == "pooled" else ReservedLayout(2, 32, 4)
    s = Scheduler(layout, num_lanes=2, max_context=32, prefill_chunk=6)
    d = Driver(s)
    a, b, c = list(range(1, 11)), list(range(11, 22)), [31, 32]
    s.add("a", a)
    s.add("b", b)
    s.add("c", c)
    A = (0, 1, 2) if kind == "pooled" else R(0, 8)
    # pooled: b's table starts past half the 10 spare ids of the free run 3..15, so that a
    # and b each have room to grow in place
    B = (8, 9, 10) if kind == "pooled" else R(8, 16)

    p = d.step()
    assert p.admitted == (Admission("a", 0, 0), Admission("b", 1, 0))
    assert p.refused == () and p.truncated == () and p.copies == ()
    assert [x for x, *_ in s.waiting] == ["c"]  # no lane left: it waits
    # the oldest prefill takes the whole budget of 6 tokens; b gets nothing yet
    assert p.work == (LaneWork(0, "a", (1, 2, 3, 4, 5, 6), 0, A, False, prompt=True),)

    p = d.step()
    assert p.admitted == ()
    assert p.work == (
        LaneWork(0, "a", (7, 8, 9, 10), 6, A, True, prompt=True),
        LaneWork(1, "b", (11, 12), 0, B, False, prompt=True),  # the budget left over
    )
    assert d.out == {"a": [1000]}

    p = d.step()
    # a decoding lane feeds one token and does not use the prefill budget
    assert p.work == (
        LaneWork(0, "a", (1000,), 10, A, True),
        LaneWork(1, "b", (13, 14, 15, 16, 17, 18), 2, B, False, prompt=True),
    )

    p = d.step(finish=["a"])
    assert p.work == (
        LaneWork(0, "a", (1001,), 11, A, True),
        LaneWork(1, "b", (19, 20, 21), 8, B, True, prompt=True),
    )
    assert d.out == {"a": [1000, 1001, 1002], "b": [1003]}

    p = d.step()
    # c takes the only lane not busy: a's, whose conversation gives way
    assert p.admitted == (Admission("c", 0, 0),)
    C = (5,) if kind == "pooled" else R(0, 8)  # pooled: the free runs 3..7 and 11..15 tie
    assert p.work == (
        LaneWork(1, "b", (1003,), 11, B, True),
        LaneWork(0, "c", (31, 32), 0, C, True, prompt=True),
    )
    stats = s.stats()
    if kind == "pooled":
        # a is parked: out of its lane, K/V still in the pool
        assert (stats.num_conversations_parked, stats.num_chunks_parked) == (1, 3)
        assert (stats.num_chunks_held, stats.num_chunks_free) == (7, 9)
        assert stats.chunks_per_lane == (1, 3)
        (parked,) = [conv for conv in s.cache if conv.lane is None]
        assert parked.token_ids == a + [1000, 1001] and parked.table.chunk_ids == [0, 1, 2]
        assert s.counters.num_evictions == 0
    else:
        # the reserved layout has nowhere to park: a's conversation is gone
        assert (stats.num_conversations_parked, stats.num_chunks_parked) == (0, 0)
        assert stats.chunks_per_lane == (8, 8) and stats.num_chunks_free == 0
        assert len(s.cache) == 2
        assert s.counters.num_evictions == 1


# ---- follow-ups ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["pooled", "reserved"])
def test_follow_up_extends_its_conversation_in_its_own_lane(kind):
    layout = pooled(8) if kind == "pooled" else ReservedLayout(2, 32, 4)
    s = Scheduler(layout, num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("a", [1, 2, 3, 4, 5])
    s.add("b", [6, 7, 8])
    d.step()
    d.step(finish=["b", "a"])  # b is now the least recently used
    assert d.out == {"a": [1000, 1002], "b": [1001, 1003]}
    conv_a = s.lanes[0].conv
    assert conv_a.token_ids == [1, 2, 3, 4, 5, 1000]  # the last sampled token was never fed
    before_b = tables(s)[s.lanes[1].conv.conv_id]

    follow = [1, 2, 3, 4, 5, 1000, 1002, 50, 51]
    s.add("a2", follow)
    p = d.step()
    assert p.admitted == (Admission("a2", 0, 6),)  # its own lane, though lane 1 is the LRU one
    chunks = (0, 1, 2) if kind == "pooled" else R(0, 8)  # pooled: b's chunk is 4, a grows in place
    assert p.work == (LaneWork(0, "a2", (1002, 50, 51), 6, chunks, True, prompt=True),)  # only the new tokens
    assert p.copies == ()
    assert s.lanes[0].conv is conv_a and conv_a.conv_id in {c.conv_id for c in s.cache}
    assert conv_a.checkpoints == [0, 6]
    assert s.counters.num_cached_tokens == 6
    assert s.counters.num_cells_copied == 0
    assert tables(s)[s.lanes[1].conv.conv_id] == before_b  # b untouched
    assert len(s.cache) == 2


# ---- branches --------------------------------------------------------------------------------


def _first_turn(s: Scheduler, d: Driver, prompt):
    s.add("a", prompt)
    d.step(finish=["a"])
    return s.lanes[0].conv


def test_branch_pooled_shares_full_chunks_and_copies_the_partial_one():
    s = Scheduler(pooled(8), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    orig = _first_turn(s, d, first)
    assert orig.table.chunk_ids == [0, 1, 2]

    s.add("br", first[:6] + [90, 91])
    p = d.step()
    assert p.admitted == (Admission("br", 1, 6, True),)  # an empty lane: the original stays in lane 0
    # the copy's id follows chunk 0, whose next is held: past half the free run 3..7
    assert p.copies == (CellCopy(src_chunk=1, dst_chunk=5, start=0, num_cells=2),)
    # 8 cells fill [0, 5]; chunk 6 is the room for the token it decodes first
    assert p.work == (LaneWork(1, "br", (90, 91), 6, (0, 5, 6), True, prompt=True),)
    assert refcounts(s) == [2, 1, 1, 0, 0, 1, 1, 0]
    assert s.counters.num_cells_copied == 2
    assert s.counters.num_cached_tokens == 6
    # the original is cached, whole
    assert s.lanes[0].conv is orig
    assert orig.token_ids == first and orig.table.chunk_ids == [0, 1, 2] and not orig.is_active
    assert s.lanes[1].conv.token_ids == first[:6] + [90, 91]
    s.finish("br")  # its first decoded token was never fed: chunk 6 goes back
    assert s.lanes[1].conv.table.chunk_ids == [0, 5]
    assert refcounts(s) == [2, 1, 1, 0, 0, 1, 0, 0]

    # a follow-up of the original still finds all of it
    s.add("a2", first + [1000, 7])
    p = d.step()
    assert p.admitted == (Admission("a2", 0, 10),)
    assert p.copies == ()
    assert p.work == (LaneWork(0, "a2", (1000, 7), 10, (0, 1, 2, 3), True, prompt=True),)  # 13 cells, one run


def test_branch_pooled_at_a_chunk_boundary_copies_nothing():
    s = Scheduler(pooled(8), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    _first_turn(s, d, first)
    s.add("br", first[:8] + [90])
    p = d.step()
    assert p.admitted == (Admission("br", 1, 8),)
    assert p.copies == ()
    assert p.work == (LaneWork(1, "br", (90,), 8, (0, 1, 5), True, prompt=True),)  # 2 is the original's
    assert refcounts(s) == [2, 2, 1, 0, 0, 1, 0, 0]


def test_branch_pooled_without_an_empty_lane_parks_the_original():
    s = Scheduler(pooled(8), num_lanes=1, max_context=32, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    orig = _first_turn(s, d, first)

    s.add("br", first[:6] + [90, 91])
    p = d.step(finish=["br"])
    assert p.admitted == (Admission("br", 0, 6, True),)
    assert p.copies == (CellCopy(1, 5, 0, 2),)
    assert p.work == (LaneWork(0, "br", (90, 91), 6, (0, 5, 6), True, prompt=True),)
    assert orig.lane is None and orig.token_ids == first and orig.table.chunk_ids == [0, 1, 2]
    assert s.counters.num_evictions == 0
    assert s.stats().num_conversations_parked == 2  # the parked original and the finished branch
    assert refcounts(s) == [2, 1, 1, 0, 0, 1, 0, 0]

    # the original comes back into the lane without a copy; the branch is parked in turn
    s.add("a2", first + [1000, 7])
    p = d.step()
    assert p.admitted == (Admission("a2", 0, 10),)
    assert p.copies == ()
    assert s.lanes[0].conv is orig
    assert p.work == (LaneWork(0, "a2", (1000, 7), 10, (0, 1, 2, 3), True, prompt=True),)
    assert s.counters.num_moves_swap == 0 and s.counters.num_cells_copied == 2


def test_branch_reserved_copies_into_an_empty_lane():
    s = Scheduler(ReservedLayout(2, 16, 4), num_lanes=2, max_context=16, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    orig = _first_turn(s, d, first)
    s.add("br", first[:6] + [90, 91])
    p = d.step()
    assert p.admitted == (Admission("br", 1, 6, True),)
    assert p.copies == (CellCopy(0, 4, 0, 4), CellCopy(1, 5, 0, 2))
    assert p.work == (LaneWork(1, "br", (90, 91), 6, (4, 5, 6, 7), True, prompt=True),)
    assert s.counters.num_cells_copied == 6
    assert s.lanes[0].conv is orig and orig.token_ids == first and orig.num_cells == 10


def test_branch_reserved_without_an_empty_lane_branches_in_place():
    s = Scheduler(ReservedLayout(1, 16, 4), num_lanes=1, max_context=16, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    orig = _first_turn(s, d, first)
    s.add("br", first[:6] + [90, 91])
    p = d.step()
    assert p.admitted == (Admission("br", 0, 6),)
    assert p.copies == ()
    assert p.work == (LaneWork(0, "br", (90, 91), 6, (0, 1, 2, 3), True, prompt=True),)
    assert s.lanes[0].conv is orig  # cut back to the shared prefix, then extended
    assert orig.token_ids == first[:6] + [90, 91]
    assert len(s.cache) == 1 and s.counters.num_cells_copied == 0


def test_branch_from_a_running_conversation_forks_it():
    s = Scheduler(pooled(8), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    s.add("a", first)
    d.step()  # a is decoding, 10 cells in [0, 1, 2]
    s.add("br", first + [90])  # shares all of a's cells, but a is busy: fork
    p = d.step()
    assert p.admitted == (Admission("br", 1, 10, True),)
    assert p.copies == (CellCopy(2, 5, 0, 2),)
    assert p.work == (
        LaneWork(0, "a", (1000,), 10, (0, 1, 2), True),
        LaneWork(1, "br", (90,), 10, (0, 1, 5), True, prompt=True),
    )
    assert refcounts(s) == [2, 2, 1, 0, 0, 1, 0, 0]


# ---- slot choice -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["pooled", "reserved"])
def test_slot_choice(kind):
    layout = pooled(16) if kind == "pooled" else ReservedLayout(3, 16, 4)
    s = Scheduler(layout, num_lanes=3, max_context=16, prefill_chunk=64)
    d = Driver(s)
    s.add("a", [1, 1])
    s.add("b", [2, 2])
    d.step(finish=["b", "a"])
    conv_a, conv_b = s.lanes[0].conv, s.lanes[1].conv

    # an empty lane first, though two lanes are idle
    s.add("c", [3, 3])
    p = d.step(finish=["c"])
    assert p.admitted == (Admission("c", 2, 0),)
    assert s.lanes[0].conv is conv_a and s.lanes[1].conv is conv_b

    # no empty lane: the least recently used idle lane (b finished first)
    s.add("d", [4, 4])
    p = d.step()
    assert p.admitted == (Admission("d", 1, 0),)
    assert s.lanes[0].conv is conv_a
    if kind == "pooled":
        assert conv_b.lane is None and s.cache.get(conv_b.conv_id) is conv_b
        assert s.counters.num_evictions == 0
    else:
        assert s.cache.get(conv_b.conv_id) is None
        assert s.counters.num_evictions == 1

    # next LRU idle lane: a's (lane 0), not c's (lane 2)
    s.add("e", [5, 5])
    p = d.step()
    assert p.admitted == (Admission("e", 0, 0),)

    # a follow-up goes to the lane holding its prefix, even when it is not the LRU one
    s.finish("d")
    s.finish("e")  # the LRU idle lane is now 2 (c)
    s.add("d2", [4, 4] + d.out["d"][:1] + [9])
    p = d.step()
    assert p.admitted == (Admission("d2", 1, 3),)


def test_prefix_ties_go_to_an_idle_conversation_then_the_most_recent():
    s = Scheduler(pooled(8), num_lanes=3, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("x", [1, 2, 3])
    s.add("y", [1, 2, 3, 7, 7])
    d.step(finish=["x"])  # x idle with [1, 2, 3]; y running with [1, 2, 3, 7, 7]
    s.add("z", [1, 2, 3, 9])  # shares 3 tokens with both
    p = d.step()
    assert p.admitted == (Admission("z", 0, 3),)  # x, taken over in place: no fork, no copy
    assert p.copies == ()
    assert s.lanes[0].conv.token_ids == [1, 2, 3, 9]


def test_prefix_ties_between_idle_conversations_go_to_the_most_recent():
    s = Scheduler(pooled(8), num_lanes=3, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("x1", [1, 2, 3])
    s.add("x2", [1, 2, 3])  # admitted in the same step: nothing to share yet
    d.step(finish=["x1", "x2"])
    assert lane_chunks(s) == [[0], [4], None]
    s.add("z", [1, 2, 3, 9])
    p = d.step()
    assert p.admitted == (Admission("z", 1, 3),)


# ---- lane moves and parking ------------------------------------------------------------------


def test_move_pooled_is_a_swap():
    s = Scheduler(pooled(8), num_lanes=3, max_context=32, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    conv = _first_turn(s, d, first)
    held = s.layout.pool.num_held
    assert s.move(0, 2) == []
    assert s.counters.num_moves_swap == 1 and s.counters.num_moves_copy == 0
    assert s.counters.num_cells_copied == 0
    assert lane_chunks(s) == [None, None, [0, 1, 2]]
    assert s.lanes[2].conv is conv and conv.lane == 2
    assert s.layout.pool.num_held == held
    check_scheduler(s)

    s.add("a2", first + [1000, 5])
    p = d.step()
    assert p.admitted == (Admission("a2", 2, 10),)
    assert p.copies == ()
    assert p.work == (LaneWork(2, "a2", (1000, 5), 10, (0, 1, 2, 3), True, prompt=True),)  # 13 cells


def test_move_reserved_copies_every_cell():
    s = Scheduler(ReservedLayout(3, 12, 4), num_lanes=3, max_context=12, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    conv = _first_turn(s, d, first)
    copies = s.move(0, 2)
    assert copies == [CellCopy(0, 6, 0, 4), CellCopy(1, 7, 0, 4), CellCopy(2, 8, 0, 2)]
    assert s.counters.num_moves_copy == 1 and s.counters.num_moves_swap == 0
    assert s.counters.num_cells_copied == 10
    assert s.lanes[0].conv is None and s.lanes[2].conv is conv
    assert conv.table.chunk_ids == [6, 7, 8] and conv.num_cells == 10
    assert s.layout.lane_tables[0].num_cells == 0
    check_scheduler(s)

    s.add("a2", first + [1000])
    p = d.step()
    assert p.admitted == (Admission("a2", 2, 10),)
    # a cached prompt's last token is a prompt row
    assert p.work == (LaneWork(2, "a2", (1000,), 10, (6, 7, 8), True, prompt=True),)


@pytest.mark.parametrize("kind", ["pooled", "reserved"])
def test_move_onto_an_idle_lane_and_bad_moves(kind):
    layout = pooled(8) if kind == "pooled" else ReservedLayout(3, 12, 4)
    s = Scheduler(layout, num_lanes=3, max_context=12, prefill_chunk=64)
    d = Driver(s)
    s.add("a", [1, 2, 3])
    s.add("b", [4, 5])
    d.step(finish=["a"])
    conv_a, conv_b = s.lanes[0].conv, s.lanes[1].conv
    with pytest.raises(ValueError):
        s.move(1, 2)  # b is busy
    with pytest.raises(ValueError):
        s.move(2, 0)  # lane 2 holds nothing
    with pytest.raises(ValueError):
        s.move(0, 1)  # onto a busy lane
    with pytest.raises(ValueError):
        s.park(1)
    with pytest.raises(ValueError):
        s.park(2)
    s.finish("b")
    s.move(0, 1)  # b's conversation gives way to a's
    assert s.lanes[1].conv is conv_a and s.lanes[0].conv is None
    if kind == "pooled":
        assert conv_b.lane is None and s.cache.get(conv_b.conv_id) is conv_b  # parked
    else:
        assert s.cache.get(conv_b.conv_id) is None and s.counters.num_evictions == 1
    check_scheduler(s)


def test_park_then_follow_up_restores_without_copying():
    s = Scheduler(pooled(8), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    conv = _first_turn(s, d, first)
    s.park(0)
    assert s.lanes[0].conv is None and conv.lane is None
    stats = s.stats()
    assert (stats.num_conversations_parked, stats.num_chunks_parked, stats.num_chunks_held) == (1, 3, 3)
    assert stats.chunks_per_lane == (0, 0)
    check_scheduler(s)

    s.add("b", [20, 21, 22])
    p = d.step()
    assert p.admitted == (Admission("b", 0, 0),)
    assert p.work[0].chunk_ids == (5,)  # past half the free run 3..7: room for a to grow

    s.add("a2", first + [1000, 7])
    p = d.step()
    assert p.admitted == (Admission("a2", 1, 10),)
    assert p.copies == ()
    assert s.lanes[1].conv is conv
    assert LaneWork(1, "a2", (1000, 7), 10, (0, 1, 2, 3), True, prompt=True) in p.work  # 13 cells, one run
    assert s.counters.num_cells_copied == 0
    assert s.counters.num_moves_swap == 0  # restoring from the pool is not a lane move


def test_park_in_reserved_layout_keeps_the_conversation_in_its_lane():
    """The reserved layout has no pool to park in: its K/V already lives in the lane."""
    s = Scheduler(ReservedLayout(2, 16, 4), num_lanes=2, max_context=16, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    conv = _first_turn(s, d, first)
    s.park(0)
    assert s.lanes[0].conv is conv and conv.lane == 0
    assert len(s.cache) == 1 and s.counters.num_evictions == 0
    check_scheduler(s)
    s.add("a2", first + [1000])
    p = d.step()
    assert p.admitted == (Admission("a2", 0, 10),)
    assert p.copies == ()


# ---- pool full: (1) parked conversations give way ---------------------------------------------


def _three_idle(s: Scheduler, d: Driver, active=None):
    """X (1 chunk), Y (2 chunks), Z (2 chunks), idle, LRU in that order; optionally one active lane first.

    Z's 8 cells are admitted with a third chunk for the token it would decode; finishing
    gives that chunk back."""
    if active is not None:
        s.add("A", active)
    s.add("X", [1, 1, 1])
    s.add("Y", [2] * 7)
    s.add("Z", [3] * 8)
    d.step(finish=["X", "Y", "Z"])


def test_pool_full_evicts_lru_first_only_what_is_needed():
    s = Scheduler(pooled(6), num_lanes=3, max_context=32, prefill_chunk=64)
    d = Driver(s)
    _three_idle(s, d)
    # Y starts past half the free run 1..5; Z fills the run 4..5, then took 1 for its
    # third chunk and gave it back
    assert lane_chunks(s) == [[0], [2, 3], [4, 5]]
    s.add("W", [4] * 5)  # 2 chunks, 1 free: X alone covers it
    p = d.step()
    assert p.admitted == (Admission("W", 0, 0),)
    assert s.counters.num_evictions == 1
    assert lane_chunks(s) == [[0, 1], [2, 3], [4, 5]]
    assert sorted(c.token_ids[0] for c in s.cache) == [2, 3, 4]


def test_pool_full_evicts_two_lru_when_one_is_not_enough():
    s = Scheduler(pooled(6), num_lanes=3, max_context=32, prefill_chunk=64)
    d = Driver(s)
    _three_idle(s, d)
    assert s.layout.pool.num_free == 1
    s.add("W", [4] * 12)  # 13 cells, 4 chunks: 1 free and X's 1 are not enough; and Y's 2 are
    p = d.step()
    assert p.admitted == (Admission("W", 0, 0),)
    assert p.refused == ()
    assert s.counters.num_evictions == 2
    assert lane_chunks(s) == [[0, 1, 2, 3], None, [4, 5]]
    assert sorted(c.token_ids[0] for c in s.cache) == [3, 4]  # Z, the most recent, stays


def test_pool_full_evicts_nothing_and_refuses_when_all_would_not_be_enough():
    s = Scheduler(pooled(8), num_lanes=4, max_context=32, prefill_chunk=64)
    d = Driver(s)
    _three_idle(s, d, active=[5] * 6)  # A keeps [0, 1] and decodes on
    assert lane_chunks(s) == [[0, 1], [4], [5, 6], [2, 3]]
    stats, before = s.stats(), tables(s)
    idle_before = {k: v for k, v in before.items() if not v[4]}

    s.add("W", [4] * 25)  # 7 chunks: 1 free + 5 from X, Y and Z = 6
    p = d.step()
    assert p.refused == (Refusal("W", 7, 6),)
    assert p.admitted == ()
    assert s.counters.num_refusals == 1 and s.counters.num_evictions == 0
    assert "W" not in s.seqs and not s.waiting
    # nothing changed but A's one decoded cell, which needed no chunk
    assert s.stats() == stats
    after = tables(s)
    assert {k: v for k, v in after.items() if not v[4]} == idle_before
    assert {k: v[1] for k, v in after.items()} == {k: v[1] for k, v in before.items()}
    assert p.work == (LaneWork(0, "A", (1000,), 6, (0, 1), True),)


def test_the_conversation_a_follow_up_extends_gives_way_last():
    s = Scheduler(pooled(4), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("x", [1, 1, 1])
    s.add("y", [2] * 7)
    d.step(finish=["x", "y"])  # x: [0], LRU; y: [1, 2]; 1 free
    conv_x = s.lanes[0].conv
    assert lane_chunks(s) == [[0], [1, 2]]
    s.add("x2", [1, 1, 1, 1000] + [5] * 7)  # 12 cells: 2 more chunks, 1 free
    p = d.step()
    # x is the least recently used, but it is what x2 extends: y gives way instead
    assert p.admitted == (Admission("x2", 0, 3),)
    assert s.counters.num_evictions == 1
    assert s.lanes[0].conv is conv_x and conv_x.table.chunk_ids == [0, 1, 2]
    assert s.lanes[1].conv is None


def test_an_idle_conversation_holding_the_room_gives_way_to_its_branch_tail_first():
    """A regenerate when the pool is full: the tail it replaces frees the room it needs."""
    s = Scheduler(pooled(3), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    x = [1] * 10
    orig = _first_turn(s, d, x)
    assert orig.table.chunk_ids == [0, 1, 2] and s.layout.pool.num_free == 0
    s.add("br", x[:6] + [9, 9])  # a fork would need 2 chunks: the copied one and one to grow
    p = d.step()
    assert p.refused == ()
    assert p.admitted == (Admission("br", 0, 6),)  # in x's lane, on x's first 6 cells
    assert p.copies == ()
    assert p.work == (LaneWork(0, "br", (9, 9), 6, (0, 1, 2), True, prompt=True),)
    assert s.lanes[0].conv is orig and orig.token_ids == x[:6] + [9, 9]
    assert len(s.cache) == 1 and s.counters.num_evictions == 0
    assert s.counters.num_cached_tokens == 6


def test_an_idle_conversation_holding_the_room_gives_way_whole_when_its_tail_is_not_enough():
    """b's prefix chunk 1 is shared with a, so branching b in place must copy it: one chunk
    short. Evicting a and b and starting fresh fits."""
    s = Scheduler(pooled(4), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    a = list(range(1, 11))
    _first_turn(s, d, a)  # a: 10 cells in [0, 1, 2]
    s.add("b", a[:8] + [20])  # forks a at a chunk boundary: shares [0, 1]
    p = d.step(finish=["b"])
    assert p.admitted == (Admission("b", 1, 8),) and p.copies == ()
    assert lane_chunks(s) == [[0, 1, 2], [0, 1, 3]] and s.layout.pool.num_free == 0

    s.add("br", a[:6] + [90] * 7)  # 14 cells: 4 chunks; b, the most recent, is its source
    p = d.step()
    assert p.refused == ()
    assert p.admitted == (Admission("br", 0, 0),)
    assert s.counters.num_evictions == 2 and s.counters.num_cached_tokens == 8  # b's only
    assert p.work == (LaneWork(0, "br", tuple(a[:6] + [90] * 7), 0, (0, 1, 2, 3), True, prompt=True),)
    assert len(s.cache) == 1 and s.lanes[1].conv is None


def test_a_branch_the_whole_pool_cannot_hold_is_refused_and_its_source_kept():
    s = Scheduler(pooled(3), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    x = [1] * 10
    orig = _first_turn(s, d, x)
    before = tables(s)
    s.add("br", x[:6] + [9] * 10)  # 17 cells: 5 chunks; evicting x would make 3 free
    p = d.step()
    assert p.refused == (Refusal("br", 5, 3),) and p.admitted == ()
    assert tables(s) == before and s.lanes[0].conv is orig and orig.token_ids == x
    assert s.counters.num_evictions == 0 and s.layout.pool.num_free == 0


def test_an_active_conversation_never_gives_way_to_its_branch():
    s = Scheduler(pooled(3), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    a = list(range(1, 11))
    s.add("a", a)
    d.step()  # a: 10 cells in [0, 1, 2], decoding
    before = tables(s)
    s.add("br", a[:6] + [90])  # a fork needs 1 chunk for the copied partial one; none free
    p = d.step()
    assert p.refused == (Refusal("br", 1, 0),)
    assert p.work == (LaneWork(0, "a", (1000,), 10, (0, 1, 2), True),)
    assert {k: v[1] for k, v in tables(s).items()} == {k: v[1] for k, v in before.items()}
    assert s.lanes[0].conv.token_ids == a + [1000]
    assert s.counters.num_evictions == 0


def test_a_prompt_that_fills_its_last_chunk_needs_room_for_one_more():
    s = Scheduler(pooled(2), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("full", [1] * 8)  # 8 cells fill 2 chunks; its first decoded token needs a third
    s.add("fits", [2] * 7)
    p = d.step()
    assert p.refused == (Refusal("full", 3, 2),)
    assert p.admitted == (Admission("fits", 0, 0),)
    assert p.work == (LaneWork(0, "fits", (2,) * 7, 0, (0, 1), True, prompt=True),)
    p = d.step()  # the first decoded token goes into the room admission kept
    assert p.truncated == () and p.work == (LaneWork(0, "fits", (1000,), 7, (0, 1), True),)


def test_refusal_does_not_block_the_next_request():
    s = Scheduler(pooled(4), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("big", [1] * 20)  # 21 cells: 6 chunks > 4
    s.add("small", [2, 2])
    p = d.step()
    assert p.refused == (Refusal("big", 6, 4),)
    assert p.admitted == (Admission("small", 0, 0),)
    assert s.counters.num_refusals == 1


def test_refusal_leaves_shared_chunks_alone():
    """No idle conversation to give way: a2 extends the cached turn and is running."""
    s = Scheduler(pooled(4), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    first = [1] * 8
    s.add("a", first)
    d.step(finish=["a"])  # idle, [0, 1] (the room for a decoded token went back)
    assert lane_chunks(s) == [[0, 1], None]
    s.add("a2", first + [1000, 5])  # extends it in lane 0: [0, 1, 2]
    d.step()
    before = tables(s)
    s.add("n", [7] * 8)  # 9 cells need 3 chunks, 1 is free
    p = d.step()
    assert p.refused == (Refusal("n", 3, 1),)
    assert {k: v[1] for k, v in tables(s).items()} == {k: v[1] for k, v in before.items()}
    assert s.counters.num_evictions == 0


# ---- pool full: (3) decoding lanes that cannot grow -------------------------------------------


def _two_full_lanes(s: Scheduler, d: Driver):
    s.add("a", [1, 2, 3, 4, 5, 6, 7])
    s.add("b", [8, 9, 10, 11, 12, 13, 14])
    d.step()  # 7 cells each, [0, 1] and [2, 3]
    d.step()  # 8 cells each: the next token needs a new chunk


def test_two_lanes_cannot_grow_the_youngest_ends():
    s = Scheduler(pooled(4), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    _two_full_lanes(s, d)
    assert lane_chunks(s) == [[0, 1], [2, 3]] and s.layout.pool.num_free == 0
    p = d.step()
    assert p.truncated == ("b",)
    assert p.work == (LaneWork(0, "a", (d.out["a"][1],), 8, (0, 1, 2), True),)
    assert s.counters.num_truncations == 1
    assert "b" not in s.seqs and s.lanes[1].conv is None and s.lanes[1].seq is None
    assert refcounts(s) == [1, 1, 1, 0]
    # a carries on through the chunk it got
    for _ in range(3):
        p = d.step()
        assert p.truncated == () and p.work[0].chunk_ids == (0, 1, 2)
    p = d.step()
    assert p.work[0].chunk_ids == (0, 1, 2, 3) and p.work[0].start == 12


def test_growth_evicts_idle_before_ending_a_lane():
    s = Scheduler(pooled(3), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("a", [1, 2, 3, 4, 5, 6, 7])
    s.add("x", [20])
    d.step(finish=["x"])  # a: [0, 1], idle x: [2]
    d.step()
    p = d.step()
    assert p.truncated == ()
    assert s.counters.num_evictions == 1 and s.counters.num_truncations == 0
    assert p.work == (LaneWork(0, "a", (d.out["a"][1],), 8, (0, 1, 2), True),)
    assert len(s.cache) == 1


def test_end_more_lanes_only_when_one_was_not_enough():
    """c forks a's running conversation, so ending c frees only its private chunk."""
    s = Scheduler(pooled(5), num_lanes=3, max_context=32, prefill_chunk=64)
    d = Driver(s)
    a = [1, 2, 3, 4, 5, 6]
    s.add("a", a)
    s.add("b", [11, 12, 13, 14, 15, 16])
    d.step()  # 6 cells each, [0, 1] and [2, 3]
    s.add("c", a + [99])
    p = d.step()
    assert p.admitted == (Admission("c", 2, 6, True),)
    assert p.copies == (CellCopy(1, 4, 0, 2),)
    assert lane_chunks(s) == [[0, 1], [2, 3], [0, 4]]
    assert s.layout.pool.num_free == 0
    p = d.step()  # 8 cells each: room for them all
    assert p.truncated == ()
    # all three have 8 cells and need a chunk: 3 short, none free
    p = d.step()
    assert p.truncated == ("c", "b")  # c freed 1 chunk, 2 were needed; then b
    assert p.work == (LaneWork(0, "a", (d.out["a"][2],), 8, (0, 1, 2), True),)
    assert s.counters.num_truncations == 2
    assert refcounts(s) == [1, 1, 1, 0, 0]


def test_a_younger_lane_that_needs_nothing_is_not_ended():
    s = Scheduler(pooled(5), num_lanes=3, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("a", [1, 2, 3, 4, 5, 6, 7])
    s.add("b", [8, 9, 10, 11, 12, 13, 14])
    d.step()  # 7 cells each, [0, 1] and [2, 3]
    s.add("c", [30, 31])
    p = d.step()  # c takes the last chunk, [4]; a and b reach 8 cells
    assert p.admitted == (Admission("c", 2, 0),)
    assert lane_chunks(s) == [[0, 1], [2, 3], [4]]
    p = d.step()  # a and b need a chunk each, c (3 cells) none
    assert p.truncated == ("b",)  # the youngest among the lanes that cannot grow, not c
    assert "c" in s.seqs and "a" in s.seqs
    assert lane_chunks(s) == [[0, 1, 2], None, [4]]


def test_new_request_does_not_take_the_room_a_decoding_lane_needs_now():
    """Pool full order: a new request that does not fit is refused before a decoding lane ends."""
    s = Scheduler(pooled(3), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("a", [1, 2, 3, 4, 5, 6, 7])
    d.step()
    d.step()  # a: 8 cells in [0, 1], its next token needs a chunk; 1 chunk free
    s.add("b", [20, 21])
    p = d.step()
    assert p.truncated == ()
    assert p.refused == (Refusal("b", 1, 0),)
    assert p.work == (LaneWork(0, "a", (d.out["a"][1],), 8, (0, 1, 2), True),)


# ---- context full, abort, clear ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["pooled", "reserved"])
def test_commit_says_when_max_context_is_reached(kind):
    layout = pooled(2) if kind == "pooled" else ReservedLayout(1, 8, 4)
    s = Scheduler(layout, num_lanes=1, max_context=8, prefill_chunk=64)
    d = Driver(s)
    with pytest.raises(AssertionError):
        s.add("long", [1] * 8)  # the engine refuses prompts of max_context or more
    s.add("a", [1, 2, 3, 4, 5, 6])
    d.step()
    assert d.can_continue == {"a": True}  # 7 cells
    d.step()
    assert d.can_continue == {"a": True}  # 8 cells
    p = d.step()
    assert p.work[0].num_cells == 8
    assert d.can_continue == {"a": False}  # a 9th cell would pass max_context
    s.finish("a")
    assert s.lanes[0].conv.num_cells == 8
    check_scheduler(s)


def test_abort_waiting_and_running():
    s = Scheduler(pooled(8), num_lanes=1, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("a", list(range(1, 10)))
    s.add("b", [5, 5])
    d.step()
    assert [x for x, *_ in s.waiting] == ["b"]
    assert s.abort("b") is True
    assert not s.waiting
    assert s.abort("b") is False
    assert s.abort("nobody") is False
    assert s.layout.pool.num_held == 3
    assert s.abort("a") is True
    assert s.layout.pool.num_free == 8
    assert s.lanes[0].conv is None and s.lanes[0].seq is None and len(s.cache) == 0
    assert not s.has_work
    check_scheduler(s)


def test_abort_of_a_follow_up_keeps_the_cached_turn_and_a_fork_keeps_its_source():
    s = Scheduler(pooled(8), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    _first_turn(s, d, first)
    s.add("br", first[:6] + [90])
    d.step()
    assert refcounts(s) == [2, 1, 1, 0, 0, 1, 0, 0]  # br: [0, 5]
    s.abort("br")
    assert refcounts(s) == [1, 1, 1, 0, 0, 0, 0, 0]
    assert s.lanes[0].conv.token_ids == first
    s.add("a2", first + [1000, 3, 4, 5])
    d.step()
    assert s.lanes[0].conv.table.chunk_ids == [0, 1, 2, 3]
    s.abort("a2")  # gives back what it added; the turn it found cached stays
    assert s.lanes[0].conv.token_ids == first and s.lanes[0].conv.table.chunk_ids == [0, 1, 2]
    assert s.lanes[0].is_idle and s.layout.pool.num_free == 5 and len(s.cache) == 1
    check_scheduler(s)
    s.add("a3", first + [7])  # and is reused by the next follow-up
    p = d.step()
    assert p.admitted == (Admission("a3", 0, 10),)
    check_scheduler(s)


def test_abort_mid_prefill_frees_its_chunks():
    s = Scheduler(pooled(8), num_lanes=2, max_context=32, prefill_chunk=3)
    d = Driver(s)
    s.add("a", list(range(1, 15)))
    d.step()
    assert s.lanes[0].conv.num_cells == 3 and s.lanes[0].conv.table.chunk_ids == [0, 1, 2, 3]
    s.abort("a")
    assert s.layout.pool.num_free == 8
    check_scheduler(s)


def test_clear_cache_frees_every_chunk():
    s = Scheduler(pooled(8), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("a", [1] * 5)
    s.add("b", [2] * 3)
    d.step(finish=["a", "b"])
    s.park(0)
    s.add("c", [3] * 6)
    d.step()
    assert s.layout.pool.num_held == 5
    s.clear_cache()  # c is running: it stays
    assert s.layout.pool.num_held == 2 and len(s.cache) == 1
    assert s.counters.num_evictions == 2
    s.finish("c")
    s.clear_cache()
    assert s.layout.pool.num_free == 8 and s.layout.pool.num_held == 0
    assert len(s.cache) == 0 and all(lane.conv is None for lane in s.lanes)
    assert s.counters.num_evictions == 3
    check_scheduler(s)


def test_stats_pooled():
    s = Scheduler(pooled(8), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    _first_turn(s, d, first)
    s.add("br", first[:8] + [1])
    d.step()
    stats = s.stats()
    assert stats.num_chunks_total == 8 and stats.chunk_size == 4
    assert (stats.num_chunks_held, stats.num_chunks_free) == (4, 4)
    # chunks 0 and 1 are shared with the running branch: only chunk 2 is held by idle alone
    assert (stats.num_chunks_parked, stats.num_conversations_parked) == (1, 1)
    assert stats.chunks_per_lane == (3, 3)

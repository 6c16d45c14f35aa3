"""A step is a transaction: nothing is recorded before `commit`, and `fail` ends exactly
the requests the step carried, leaving everything else as it was (exact chunk ids).

The engine-level form (a fault injected in the forward or in the copies, on a real
tiny model) is in tests/model/test_step_faults.py.
"""

from __future__ import annotations

from test_scheduler import Driver, pooled, refcounts, tables

from strata.engine.scheduler import Scheduler
from strata.kv.reserve import ReservedLayout
from strata.kv.table import CellCopy
from strata.step import Admission, StepOutput
from tests.checks import check_scheduler


def free_list(s: Scheduler) -> list[int]:
    pool = s.layout.pool
    return [i for i in range(pool.num_total) if pool.refcount(i) == 0]


def test_schedule_records_nothing_until_commit():
    s = Scheduler(pooled(8), num_lanes=2, max_context=32, prefill_chunk=4)
    s.add("a", [1, 2, 3, 4, 5, 6])
    p = s.schedule()
    conv = s.seqs["a"].conv
    assert conv.num_cells == 0 and conv.token_ids == []  # the piece is planned, not written
    assert p.work[0].start == 0 and p.work[0].token_ids == (1, 2, 3, 4)
    assert s.schedule().work[0].start == 0  # planned again from the same place: nothing moved
    s.commit(p, StepOutput())
    assert conv.num_cells == 4 and conv.token_ids == [1, 2, 3, 4]
    check_scheduler(s)


def test_a_failed_step_ends_its_requests_and_nothing_else():
    s = Scheduler(pooled(8), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("p", [7, 7, 7, 7, 7])
    d.step(finish=["p"])  # parked idle in lane 0: chunks [0, 1]
    s.park(0)
    before_tables, before_free = tables(s), free_list(s)
    assert before_free == [2, 3, 4, 5, 6, 7]

    s.add("a", [1, 2, 3])
    s.add("b", [4, 5, 6, 8, 9])
    s.add("w", [3, 3])  # waits: both lanes are taken
    p = s.schedule()
    assert [a.request_id for a in p.admitted] == ["a", "b"]
    assert s.fail(p) == ("a", "b")
    check_scheduler(s)
    assert not s.seqs and [r for r, *_ in s.waiting] == ["w"]
    assert tables(s) == before_tables and free_list(s) == before_free
    assert s.counters.num_failed_steps == 1

    d.step()  # the engine carries on: the waiting request runs
    assert set(s.seqs) == {"w"}


def test_a_failed_decode_step_ends_the_decoding_lanes_not_the_waiting_one():
    s = Scheduler(pooled(8), num_lanes=1, max_context=32, prefill_chunk=64)
    d = Driver(s)
    s.add("a", [1, 2, 3, 4, 5])
    s.add("w", [9, 9])
    d.step()  # a decodes next; w waits for the lane
    p = s.schedule()
    assert [w.request_id for w in p.work] == ["a"]
    assert s.fail(p) == ("a",)
    assert refcounts(s) == [0] * 8  # a was a new conversation: all of it goes back
    assert [r for r, *_ in s.waiting] == ["w"]
    p = d.step()
    assert p.admitted == (Admission("w", 0, 0),)


def test_a_failed_follow_up_leaves_the_turn_it_found_cached():
    s = Scheduler(pooled(8), num_lanes=1, max_context=32, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    s.add("a", first)
    d.step()
    d.step(finish=["a"])  # 11 cells: the prompt and one fed output, chunks [0, 1, 2]
    found = s.lanes[0].conv
    before_tables, before_free = tables(s), free_list(s)
    s.add("a2", found.token_ids + [50, 51, 52, 53, 54])  # grows into chunks 3 and 4
    p = s.schedule()
    assert p.admitted == (Admission("a2", 0, 11),) and p.work[0].chunk_ids == (0, 1, 2, 3, 4)
    assert s.fail(p) == ("a2",)
    check_scheduler(s)
    assert tables(s) == before_tables and free_list(s) == before_free
    assert s.lanes[0].conv is found and not found.is_active


def test_a_failed_fork_frees_the_fork_and_keeps_its_source():
    s = Scheduler(pooled(8), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    s.add("a", first)
    d.step(finish=["a"])
    before_tables, before_refs = tables(s), refcounts(s)
    s.add("br", first[:6] + [90, 91])
    p = s.schedule()
    assert p.admitted == (Admission("br", 1, 6, True),) and p.copies == (CellCopy(1, 5, 0, 2),)
    assert s.fail(p) == ("br",)
    check_scheduler(s)
    assert tables(s) == before_tables and refcounts(s) == before_refs


def test_a_failed_in_place_branch_that_copied_drops_the_half_copied_conversation():
    """A branch in place that cuts into a chunk another conversation shares copies that
    chunk's kept cells first (copy on write); if the step fails, those cells may be half
    copied, so the conversation cannot stay cached. Everything else is as it was."""
    s = Scheduler(pooled(6), num_lanes=2, max_context=32, prefill_chunk=64)
    d = Driver(s)
    x = list(range(1, 10))
    s.add("x", x)
    d.step(finish=["x"])  # X in lane 0: 9 cells, chunks [0, 1, 2]
    s.add("y", x[:8] + [70 + i for i in range(9)])
    d.step(finish=["y"])  # Y forks X at 8 in lane 1: chunks [0, 1, 3, 4, 5], the pool is full
    assert refcounts(s) == [2, 2, 1, 1, 1, 1]
    conv_x = s.lanes[0].conv
    x_before = (tuple(conv_x.table.chunk_ids), tuple(conv_x.token_ids))

    s.add("z", x[:6] + [88, 89, 90, 91])  # shares 6 with Y (the most recent): a fork has no room
    p = s.schedule()
    assert p.admitted == (Admission("z", 1, 6, True),)  # Y is cut back in place...
    # ...copying its cells of the chunk X shares, into a new run past half the free run 3..5
    assert p.copies == (CellCopy(1, 4, 0, 2),)
    assert s.fail(p) == ("z",)
    check_scheduler(s)
    assert s.lanes[1].conv is None and len(s.cache) == 1  # Y is gone, X stays
    assert (tuple(conv_x.table.chunk_ids), tuple(conv_x.token_ids)) == x_before
    assert refcounts(s) == [1, 1, 1, 0, 0, 0]


def test_a_failed_reserved_branch_keeps_the_lanes_reservations():
    s = Scheduler(ReservedLayout(2, 16, 4), num_lanes=2, max_context=16, prefill_chunk=64)
    d = Driver(s)
    first = list(range(1, 11))
    s.add("a", first)
    d.step(finish=["a"])
    before = tables(s)
    s.add("br", first[:6] + [90, 91])
    p = s.schedule()
    assert p.admitted == (Admission("br", 1, 6, True),)
    assert s.fail(p) == ("br",)
    check_scheduler(s)
    assert tables(s) == before and s.lanes[1].conv is None
    assert s.layout.lane_tables[1].num_cells == 0 and len(s.layout.lane_tables[1].chunk_ids) == 4

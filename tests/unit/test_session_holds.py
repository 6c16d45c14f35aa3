"""Session files in flight, in the scheduler's bookkeeping (engine/holds.py; no model, no torch).

- A state machine (the scheduler's, tests/unit/test_scheduler_states.py) with saves that start
  on any idle conversation and end at any later point, while requests extend, branch, evict
  and fail around them: every cell a save holds still reads back what it held when the save
  began (a fake K/V store records every cell each step and copy writes), refcounts count the
  holds, and free + held == total.
- A follow-up of a conversation being saved writes a private copy of its partial last chunk
  (copy-on-write at admission); an evicted one leaves its chunks to the save.
- Reserved: the save pins its lane; a follow-up waits, other requests take other lanes.
- A restore's room is held by no conversation; a request extending it waits and one that does
  not goes on; finishing makes it visible and the waiting request reuses it; an erase wins.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from strata.engine.scheduler import Scheduler
from strata.kv.layout import PooledLayout
from strata.kv.reserve import ReservedLayout
from strata.kv.table import CellCopy
from strata.step import Sampled, StepOutput
from tests.checks import check_scheduler
from tests.unit.test_scheduler_states import SETTINGS, SchedulerMachine


class SavesMachine(SchedulerMachine):
    NUM_CHUNKS = 10

    def __init__(self):
        super().__init__()
        self.saves = []  # (hold, what each of its cells held when the save began, its conversation)

    @precondition(lambda self: len(self.saves) < 3 and any(not c.is_active and c.num_cells for c in self.s.cache))
    @rule(data=st.data())
    def begin_save(self, data):
        idle = sorted((c for c in self.s.cache if not c.is_active and c.num_cells), key=lambda c: c.conv_id)
        conv = data.draw(st.sampled_from(idle))
        n = data.draw(st.one_of(st.just(conv.num_cells), st.integers(1, conv.num_cells)))
        hold = self.s.holds.hold_save(conv, n)
        c = self.CHUNK
        held = [self.kv.get((hold.table.chunk_ids[p // c], p % c)) for p in range(n)]
        assert held == [tuple(conv.token_ids[: p + 1]) for p in range(n)]
        self.saves.append((hold, held, conv))

    @precondition(lambda self: self.saves)
    @rule(data=st.data(), extra=st.lists(st.sampled_from((1, 2, 3)), min_size=1, max_size=6),
          seed=st.integers(0, 2**32 - 1))
    def follow_up_of_a_saved_conversation(self, data, extra, seed):
        """It extends all of the conversation while the save is in flight, and runs a few steps."""
        _, _, conv = self.saves[data.draw(st.integers(0, len(self.saves) - 1))]
        if self.s.cache.get(conv.conv_id) is not conv or len(conv.token_ids) + len(extra) >= self.MAX_CONTEXT:
            return
        self.submit(conv.token_ids + extra)
        event("a follow-up of a conversation being saved")
        if self.s.layout.num_chunks_to_truncate(conv.table, conv.num_cells):
            event("its last chunk is shared with the save")
        rng = random.Random(seed)
        for _ in range(3):
            self.one_step(rng, finish_rate=0.2)
            self.check_all()

    @precondition(lambda self: self.saves)
    @rule(data=st.data())
    def end_save(self, data):
        hold, held, _ = self.saves.pop(data.draw(st.integers(0, len(self.saves) - 1)))
        c = self.CHUNK
        assert [self.kv.get((hold.table.chunk_ids[p // c], p % c)) for p in range(hold.table.num_cells)] == held
        holders = Counter(i for conv in self.s.cache for i in conv.table.chunk_ids)
        if any(holders[i] == 0 for i in hold.table.chunk_ids):
            event("a save outlived some of its chunks' conversations")  # evicted, or copied on write
        self.s.holds.release_save(hold)
        self.s.unblock()

    @rule()
    def clear_cache(self):
        s = self.s
        s.clear_cache()
        assert all(c.is_active for c in s.cache)
        active = {i for seq in s.seqs.values() for i in seq.conv.table.chunk_ids}
        saved = {i for t in s.holds.tables() for i in t.chunk_ids}
        assert s.layout.pool.num_held == len(active | saved)  # what saves hold stays held

    def chunk_holders_match_refcounts(self):
        s = self.s
        pool = s.layout.pool
        in_convs = Counter(i for conv in s.cache for i in conv.table.chunk_ids)
        holders = in_convs + Counter(i for t in s.holds.tables() for i in t.chunk_ids)
        for i in range(pool.num_total):
            assert holders[i] == pool.refcount(i), (i, holders[i], pool.refcount(i))
        stats = s.stats()
        assert stats.num_chunks_free + stats.num_chunks_held == stats.num_chunks_total == pool.num_total
        assert stats.num_chunks_held == len(holders)
        assert stats.num_chunks_session == len(set(holders) - set(in_convs))

    def teardown(self):
        for hold, _, _ in self.saves:
            self.s.holds.release_save(hold)
        self.saves.clear()
        super().teardown()


TestSavesInFlight = SavesMachine.TestCase
TestSavesInFlight.settings = settings(SETTINGS, max_examples=200)


# ---- deterministic cases ------------------------------------------------------------------------
CHUNK = 4


def pooled(num_chunks: int = 12, num_lanes: int = 2) -> Scheduler:
    return Scheduler(PooledLayout(num_chunks, CHUNK), num_lanes, 32, 64)


def run(s: Scheduler, request_id: str, prompt: list[int], new: int = 2) -> None:
    """Serves one request to its end: the prompt, then `new` sampled tokens (all fed but the last)."""
    s.add(request_id, prompt)
    sampled = 0
    while sampled < new:
        plan = s.schedule()
        out = tuple(Sampled(w.request_id, 7, None) for w in plan.work if w.do_sample)
        s.commit(plan, StepOutput(out))
        check_scheduler(s)
        sampled += sum(1 for o in out if o.request_id == request_id)
    s.finish(request_id)
    check_scheduler(s)


def test_a_follow_up_of_a_conversation_being_saved_copies_its_partial_chunk():
    s = pooled()
    run(s, "a", list(range(1, 7)))  # 6 prompt tokens + 1 fed: 7 cells, the last chunk partial
    conv = s.lanes[0].conv
    assert conv.num_cells == 7
    hold = s.holds.hold_save(conv, conv.num_cells)
    held_ids = list(hold.table.chunk_ids)
    check_scheduler(s)
    assert s.layout.pool.refcount(held_ids[-1]) == 2
    s.add("b", conv.token_ids + [9, 9])  # extends all of it
    plan = s.schedule()
    assert [a.request_id for a in plan.admitted] == ["b"] and plan.admitted[0].num_cached == 7
    (cow,) = plan.copies
    assert cow == CellCopy(held_ids[-1], conv.table.chunk_ids[1], 0, 3)
    assert conv.table.chunk_ids[0] == held_ids[0] and conv.table.chunk_ids[1] != held_ids[1]
    assert s.layout.pool.refcount(held_ids[-1]) == 1  # the save's alone now
    check_scheduler(s)
    s.abort("b")
    s.clear_cache()  # the conversation is evicted: its chunks stay held by the save
    assert s.layout.pool.num_held == 2 and s.stats().num_chunks_session == 2
    check_scheduler(s)
    s.holds.release_save(hold)
    assert s.layout.pool.num_free == s.layout.pool.num_total
    check_scheduler(s)


def test_reserved_a_save_pins_its_lane_a_follow_up_waits_others_go_on():
    s = Scheduler(ReservedLayout(2, 32, CHUNK), 2, 32, 64)
    run(s, "a", [1, 2, 3, 4, 5])
    conv = s.lanes[0].conv
    hold = s.holds.hold_save(conv, conv.num_cells)
    assert s.lanes[0].pinned_by == hold.hold_id
    s.add("follow", conv.token_ids + [8])
    s.add("other", [20, 21, 22])
    plan = s.schedule()
    assert [(a.request_id, a.lane) for a in plan.admitted] == [("other", 1)]
    assert [r for r, *_ in s.waiting] == ["follow"]
    check_scheduler(s)
    s.abort("other")
    assert not s.has_work  # only a request waiting for the save
    s.holds.release_save(hold)
    s.unblock()
    assert s.has_work
    plan = s.schedule()
    assert [(a.request_id, a.lane, a.num_cached) for a in plan.admitted] == [("follow", 0, conv.num_cells)]
    check_scheduler(s)


def test_a_restore_is_invisible_until_finished_and_a_request_extending_it_waits():
    s = pooled()
    tokens = list(range(100, 110))
    hold = s.holds.begin_restore(tokens, [0], None)
    table = s.holds.take(hold, s.holds.plan_restore(hold))
    assert len(table.chunk_ids) == 3 and s.layout.pool.num_held == 3 and len(s.cache) == 0
    check_scheduler(s)
    s.add("extends", tokens + [1, 2])
    s.add("unrelated", [5, 6, 7])
    plan = s.schedule()
    assert [a.request_id for a in plan.admitted] == ["unrelated"]
    assert [r for r, *_ in s.waiting] == ["extends"]
    conv = s.holds.finish(hold)
    s.unblock()
    assert s.cache.get(conv.conv_id) is conv and conv.lane is None and conv.token_ids == tokens
    plan = s.schedule()
    assert [(a.request_id, a.num_cached) for a in plan.admitted] == [("extends", 10)]
    check_scheduler(s)


def test_an_erase_of_its_lane_wins_over_a_restore():
    s = pooled()
    run(s, "a", [1, 2, 3])
    free_before = s.layout.pool.num_free
    hold = s.holds.begin_restore(list(range(50, 60)), [], 0)
    s.holds.take(hold, s.holds.plan_restore(hold))
    assert s.lanes[0].is_pinned and s.layout.pool.num_free == free_before - 3
    assert s.holds.drop_lane(0) is hold and hold.dropped
    assert not s.holds.waits_for_restore(list(range(50, 60)))
    assert s.lanes.erase(0) > 0
    s.holds.drop(hold)  # the worker has stopped: its room goes back
    assert not s.lanes[0].is_pinned and s.layout.pool.num_free == s.layout.pool.num_total
    check_scheduler(s)

"""A state machine over the scheduler: random interleavings, invariants after every step.

Requests share prefixes by chance (a three-token vocabulary), as branches and follow-ups
of earlier ones, and through a few system prompts whose lengths end on and inside chunk
borders. After every step `Scheduler.check` also compares the cache's prefix index with
a brute-force scan.

No model: a fake K/V store records, for every cell the scheduler writes, the whole token
prefix whose K/V it would hold. After every rule each held conversation must read back
exactly its own token history from its chunk table; together with the checks on every
`LaneWork` (it starts where the request's K/V ends and feeds exactly the next tokens),
that is the model-free form of "greedy output is the same whatever the memory layout".
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from strata.engine.cache import common_prefix_len
from strata.engine.scheduler import Scheduler
from strata.kv.layout import PooledLayout
from strata.kv.reserve import ReservedLayout
from strata.step import Sampled, StepOutput, StepPlan
from tests.checks import check_scheduler

VOCAB = (1, 2, 3)  # tiny, so prompts share prefixes by chance
tokens_st = st.lists(st.sampled_from(VOCAB), min_size=1, max_size=8)


@dataclass
class Req:
    prompt: list[int]
    stream: list[int] = field(default_factory=list)  # prompt + sampled tokens
    state: str = "waiting"  # waiting | running | finished | refused | truncated | aborted | failed
    progress: int = 0  # tokens of `stream` whose K/V is in the conversation
    order: int = 0  # admission order
    pending: bool = False  # a sampled token waits to be fed

    def __post_init__(self):
        self.stream = list(self.prompt)


class SchedulerMachine(RuleBasedStateMachine):
    POOLED = True
    NUM_LANES = 3
    CHUNK = 4
    NUM_CHUNKS = 8
    MAX_CONTEXT = 24
    PREFILL = 5

    def __init__(self):
        super().__init__()
        if self.POOLED:
            layout = PooledLayout(self.NUM_CHUNKS, self.CHUNK)
        else:
            layout = ReservedLayout(self.NUM_LANES, self.MAX_CONTEXT, self.CHUNK)
        self.s = Scheduler(layout, self.NUM_LANES, self.MAX_CONTEXT, self.PREFILL)
        self.kv: dict[tuple[int, int], tuple[int, ...]] = {}  # (chunk, cell) -> token prefix
        self.reqs: dict[str, Req] = {}
        self.histories: list[list[int]] = []  # prompt + outputs of finished requests
        self.prompts: list[list[int]] = []
        self.num_ids = 0
        self.num_admitted = 0

    # ---- helpers ----------------------------------------------------------------------------
    def submit(self, prompt: list[int]) -> None:
        prompt = prompt[: self.MAX_CONTEXT - 1]
        request_id = f"r{self.num_ids}"
        self.num_ids += 1
        self.reqs[request_id] = Req(prompt)
        self.prompts.append(prompt)
        self.s.add(request_id, prompt)

    def apply_copies(self, copies) -> None:
        for c in copies:
            for i in range(c.start, c.start + c.num_cells):
                if (c.src_chunk, i) in self.kv:
                    self.kv[(c.dst_chunk, i)] = self.kv[(c.src_chunk, i)]
                else:
                    self.kv.pop((c.dst_chunk, i), None)

    def running(self) -> list[str]:
        return [r for r, q in self.reqs.items() if q.state == "running"]

    # ---- requests -----------------------------------------------------------------------------
    @rule(prompt=st.lists(st.sampled_from(VOCAB), min_size=1, max_size=23))
    def new_conversation(self, prompt):
        self.submit(prompt)

    @rule(data=st.data())
    def long_conversation(self, data):
        """Long enough that two or three of them fill the pool."""
        n = data.draw(st.integers(self.MAX_CONTEXT // 2, self.MAX_CONTEXT - 1))
        self.submit(data.draw(st.lists(st.sampled_from(VOCAB), min_size=n, max_size=n)))

    def system_prompts(self) -> list[list[int]]:
        """A few system prompts, ending on a chunk border, one cell either side of it, and two
        chunks in: several requests that share one of them share its full chunks."""
        c = self.CHUNK
        lengths = [c, c - 1, c + 1, 2 * c]
        return [[VOCAB[(i + k * k) % len(VOCAB)] for k in range(n)] for i, n in enumerate(lengths)]

    @rule(which=st.integers(0, 3), tail=st.lists(st.sampled_from(VOCAB), max_size=6))
    def shared_system_prompt(self, which, tail):
        self.submit(self.system_prompts()[which] + tail)

    @rule(which=st.integers(0, 3), tails=st.lists(st.lists(st.sampled_from(VOCAB), max_size=4), min_size=2, max_size=4),
          seed=st.integers(0, 2**32 - 1), gap=st.integers(1, 3))
    def system_prompt_burst(self, which, tails, seed, gap):
        """Requests with one system prompt arriving `gap` steps apart: each later one finds
        the earlier ones (running or done) holding its prefix."""
        rng = random.Random(seed)
        for tail in tails:
            self.submit(self.system_prompts()[which] + tail)
            for _ in range(gap):
                self.one_step(rng, finish_rate=0.3)
                self.check_all()

    @precondition(lambda self: self.histories)
    @rule(data=st.data(), extra=tokens_st)
    def follow_up(self, data, extra):
        history = data.draw(st.sampled_from(self.histories))
        self.submit(history + extra)

    @precondition(lambda self: self.prompts)
    @rule(data=st.data(), extra=st.lists(st.sampled_from(VOCAB), max_size=8))
    def branch(self, data, extra):
        earlier = data.draw(st.sampled_from(self.prompts + self.histories))
        cut = data.draw(st.integers(1, len(earlier)))
        self.submit(earlier[:cut] + extra)  # with no extra: a prefix, or the same prompt again

    @precondition(lambda self: any(q.state in ("waiting", "running") for q in self.reqs.values()))
    @rule(data=st.data())
    def abort(self, data):
        live = sorted(r for r, q in self.reqs.items() if q.state in ("waiting", "running"))
        request_id = data.draw(st.sampled_from(live))
        assert self.s.abort(request_id) is True
        self.reqs[request_id].state = "aborted"
        assert request_id not in self.s.seqs
        assert request_id not in [r for r, *_ in self.s.waiting]
        assert self.s.abort(request_id) is False

    @rule(data=st.data())
    def abort_unknown(self, data):
        done = sorted(r for r, q in self.reqs.items() if q.state not in ("waiting", "running"))
        request_id = data.draw(st.sampled_from(done)) if done else "nobody"
        assert self.s.abort(request_id) is False

    # ---- lanes --------------------------------------------------------------------------------
    @rule(src=st.integers(0, NUM_LANES - 1), dst=st.integers(0, NUM_LANES - 1))
    def move(self, src, dst):
        s = self.s
        src_lane, dst_lane = s.lanes[src], s.lanes[dst]
        if not src_lane.is_idle or dst_lane.is_busy:
            with pytest.raises(ValueError):
                s.move(src, dst)
            return
        conv = src_lane.conv
        before = (s.counters.num_moves_swap, s.counters.num_moves_copy, s.counters.num_cells_copied)
        copies = s.move(src, dst)
        self.apply_copies(copies)
        assert s.lanes[dst].conv is conv and conv.lane == dst
        if src == dst:
            assert copies == []
            assert before == (s.counters.num_moves_swap, s.counters.num_moves_copy, s.counters.num_cells_copied)
            return
        assert s.lanes[src].conv is None
        if self.POOLED:
            assert copies == []
            assert s.counters.num_moves_swap == before[0] + 1
        else:
            assert sum(c.num_cells for c in copies) == conv.num_cells
            assert s.counters.num_moves_copy == before[1] + 1
            assert s.counters.num_cells_copied == before[2] + conv.num_cells

    @rule(lane=st.integers(0, NUM_LANES - 1))
    def park(self, lane):
        s = self.s
        if not s.lanes[lane].is_idle:
            with pytest.raises(ValueError):
                s.park(lane)
            return
        conv = s.lanes[lane].conv
        held = s.layout.pool.num_held
        s.park(lane)
        assert s.cache.get(conv.conv_id) is conv
        assert s.layout.pool.num_held == held
        if self.POOLED:
            assert s.lanes[lane].conv is None and conv.lane is None
        else:
            assert s.lanes[lane].conv is conv

    @rule()
    def clear_cache(self):
        s = self.s
        evictions = s.counters.num_evictions
        num_idle = sum(1 for c in s.cache if not c.is_active)
        s.clear_cache()
        assert s.counters.num_evictions == evictions + num_idle
        assert all(c.is_active for c in s.cache)
        if self.POOLED:
            active = {i for seq in s.seqs.values() for i in seq.conv.table.chunk_ids}
            assert s.layout.pool.num_held == len(active)

    # ---- a step -------------------------------------------------------------------------------
    @rule(
        seed=st.integers(0, 2**32 - 1),
        finish_rate=st.sampled_from([0.0, 0.05, 0.3, 0.8]),
        fail_rate=st.sampled_from([0.0, 0.0, 0.2, 1.0]),
        num_steps=st.integers(1, 6),
    )
    def steps(self, seed, finish_rate, fail_rate, num_steps):
        rng = random.Random(seed)
        for _ in range(num_steps):
            self.one_step(rng, finish_rate, fail_rate)
            self.check_all()

    def fail_step(self, plan: StepPlan, rng: random.Random) -> None:
        """The runner raised: its copies and the forward may have written part of their cells."""
        s = self.s
        garbage = ("garbage",)
        for c in plan.copies:
            for i in range(c.start, c.start + rng.randint(0, c.num_cells)):
                self.kv[(c.dst_chunk, i)] = garbage
        for w in plan.work:
            for p in range(w.start, w.start + rng.randint(0, len(w.token_ids))):
                self.kv[(w.chunk_ids[p // self.CHUNK], p % self.CHUNK)] = garbage
        carried = set(plan.request_ids)
        assert carried <= set(s.seqs)
        idle = {c.conv_id: (c.lane, tuple(c.table.chunk_ids), tuple(c.token_ids)) for c in s.cache if not c.is_active}
        others = {r: seq.conv.num_cells for r, seq in s.seqs.items() if r not in carried}
        waiting = list(s.waiting)
        failed_before = s.counters.num_failed_steps
        ended = s.fail(plan)
        assert set(ended) == carried and len(ended) == len(carried)
        assert s.counters.num_failed_steps == failed_before + 1
        for request_id in ended:
            self.reqs[request_id].state = "failed"
            assert request_id not in s.seqs
        # nothing the step did not carry changed: idle conversations, other lanes, the queue
        for conv_id, before in idle.items():
            conv = s.cache.get(conv_id)
            assert conv is not None and (conv.lane, tuple(conv.table.chunk_ids), tuple(conv.token_ids)) == before
        assert {r: s.seqs[r].conv.num_cells for r in others} == others
        assert list(s.waiting) == waiting
        if ended:
            event("failed step")

    def one_step(self, rng: random.Random, finish_rate: float, fail_rate: float = 0.0) -> None:
        s = self.s
        waiting_before = [r for r, *_ in s.waiting]
        counters_before = (s.counters.num_evictions, s.counters.num_refusals, s.counters.num_truncations)

        # what the head of the queue can reuse, before anything changes
        head = waiting_before[0] if waiting_before else None
        head_reuse = None
        if head is not None:
            prompt = self.reqs[head].prompt
            best = max((common_prefix_len(c.token_ids, prompt) for c in s.cache), default=0)
            head_reuse = min(best, len(prompt) - 1)

        plan = s.schedule()

        # admissions and refusals take the queue in order
        done = {a.request_id for a in plan.admitted} | {r.request_id for r in plan.refused}
        k = len(done)
        assert set(waiting_before[:k]) == done
        assert [r for r, *_ in s.waiting] == waiting_before[k:]
        if s.waiting:  # the head waits only while every lane is busy
            assert all(lane.is_busy for lane in s.lanes)
        for a in plan.admitted:
            q = self.reqs[a.request_id]
            assert q.state == "waiting"
            q.state, q.progress, q.pending = "running", a.num_cached, False
            self.num_admitted += 1
            q.order = self.num_admitted
            assert 0 <= a.num_cached < len(q.prompt)
            assert s.seqs[a.request_id].lane == a.lane
        # the head reuses the longest cached prefix (unless this step dropped conversations)
        untouched = not plan.truncated and s.counters.num_evictions == counters_before[0]
        if plan.admitted and plan.admitted[0].request_id == head and untouched:
            assert plan.admitted[0].num_cached == head_reuse
        for r in plan.refused:
            assert self.POOLED, "the reserved layout never refuses"
            assert r.num_chunks_needed > r.num_chunks_free
            self.reqs[r.request_id].state = "refused"
        for request_id in plan.truncated:
            assert self.POOLED, "the reserved layout never truncates"
            q = self.reqs[request_id]
            assert q.state == "running" and q.pending, "only a decoding lane is ended"
            q.state = "truncated"
            assert request_id not in s.seqs
        assert s.counters.num_refusals == counters_before[1] + len(plan.refused)
        assert s.counters.num_truncations == counters_before[2] + len(plan.truncated)

        if plan.request_ids and rng.random() < fail_rate:
            self.fail_step(plan, rng)
            return
        self.apply_copies(plan.copies)
        for name, n in (("refusal", len(plan.refused)), ("truncation", len(plan.truncated)),
                        ("eviction", s.counters.num_evictions - counters_before[0]),
                        ("copy", len(plan.copies)), ("reuse", sum(a.num_cached > 0 for a in plan.admitted))):
            if n:
                event(name)

        # every running request: decoding ones feed their one sampled token, prefilling ones
        # share the budget in admission order
        work = {w.request_id: w for w in plan.work}
        assert len(work) == len(plan.work)
        assert len({w.lane for w in plan.work}) == len(plan.work)
        budget = self.PREFILL
        for request_id in sorted(self.running(), key=lambda r: self.reqs[r].order):
            q = self.reqs[request_id]
            if q.pending:
                expected = (q.stream[-1],)
                do_sample = True
            else:
                n = min(len(q.prompt) - q.progress, budget)
                budget -= n
                if n == 0:
                    assert request_id not in work
                    continue
                expected = tuple(q.prompt[q.progress : q.progress + n])
                do_sample = q.progress + n == len(q.prompt)
            w = work.pop(request_id)
            assert w.lane == s.seqs[request_id].lane
            assert w.start == q.progress, (request_id, w.start, q.progress)
            assert w.token_ids == expected
            assert tuple(q.stream[w.start : w.num_cells]) == w.token_ids
            assert w.do_sample == do_sample
            assert len(w.chunk_ids) * self.CHUNK >= w.num_cells
            assert w.chunk_ids == tuple(s.seqs[request_id].conv.table.chunk_ids)
            for p in range(w.start, w.num_cells):
                self.kv[(w.chunk_ids[p // self.CHUNK], p % self.CHUNK)] = tuple(q.stream[: p + 1])
        assert not work, f"work for requests that are not running: {sorted(work)}"
        for w in plan.work:  # what the forward reads: the request's whole history, cell by cell
            stream = self.reqs[w.request_id].stream
            for p in range(w.num_cells):
                assert self.kv.get((w.chunk_ids[p // self.CHUNK], p % self.CHUNK)) == tuple(stream[: p + 1])
        # nothing is recorded before the commit
        for w in plan.work:
            assert s.seqs[w.request_id].conv.num_cells == w.start

        # sample, commit, and finish some
        sampled = tuple(Sampled(w.request_id, rng.choice(VOCAB), None) for w in plan.work if w.do_sample)
        adopted = s.counters.num_chunks_adopted
        can_continue = s.commit(plan, StepOutput(sampled))
        if s.counters.num_chunks_adopted > adopted:
            event("adopted an identical chunk")  # computed twice at once, now held once
        assert set(can_continue) == {x.request_id for x in sampled}
        for w in plan.work:
            q = self.reqs[w.request_id]
            q.progress = w.num_cells
            q.pending = False
        for w, x in zip([w for w in plan.work if w.do_sample], sampled):
            q = self.reqs[w.request_id]
            q.stream.append(x.token_id)
            assert can_continue[w.request_id] == (w.num_cells + 1 <= self.MAX_CONTEXT)
            q.pending = True
            if not can_continue[w.request_id] or rng.random() < finish_rate:
                s.finish(w.request_id)
                q.state = "finished"
                self.histories.append(list(q.stream))

    # ---- invariants -----------------------------------------------------------------------------
    @invariant()
    def check_all(self):
        check_scheduler(self.s)
        self.chunk_holders_match_refcounts()
        self.lanes_and_requests_agree()
        self.every_cell_holds_its_conversations_history()

    def chunk_holders_match_refcounts(self):
        s = self.s
        pool = s.layout.pool
        holders = Counter(i for c in s.cache for i in c.table.chunk_ids)
        if self.POOLED:
            for i in range(pool.num_total):
                assert holders[i] == pool.refcount(i), (i, holders[i], pool.refcount(i))
                if holders[i] > 1:
                    assert pool.is_shared(i)
            assert pool.num_held == len(holders)
        else:
            assert all(n == 1 for n in holders.values())
            lane_ids = [i for t in s.layout.lane_tables for i in t.chunk_ids]
            assert sorted(lane_ids) == list(range(pool.num_total))
            for conv in s.cache:
                assert conv.lane is not None and conv.table is s.layout.lane_tables[conv.lane]
        stats = s.stats()
        assert stats.num_chunks_free + stats.num_chunks_held == stats.num_chunks_total
        assert stats.num_chunks_free == pool.num_free
        # a shared chunk is counted once; the cells it saves are its extra holders' worth: from
        # the pool's own refcounts (kv/pool.py), not the tables stats.py counts holders in
        extra = [pool.refcount(i) - 1 for i in range(pool.num_total) if pool.refcount(i) > 1]
        assert stats.num_chunks_shared == len(extra)
        assert stats.num_cells_saved == sum(extra) * self.CHUNK
        shared = {i: n for i, n in holders.items() if n > 1}
        if shared:
            event("shared chunk")

    def lanes_and_requests_agree(self):
        s = self.s
        running = set(self.running())
        assert set(s.seqs) == running
        assert {r for r, *_ in s.waiting} == {r for r, q in self.reqs.items() if q.state == "waiting"}
        active = {id(seq.conv) for seq in s.seqs.values()}
        assert {id(c) for c in s.cache if c.is_active} == active
        assert len(active) == len(s.seqs)  # no conversation serves two requests
        for request_id, seq in s.seqs.items():
            assert seq.conv.lane == seq.lane and s.lanes[seq.lane].seq is seq
            q = self.reqs[request_id]
            # the conversation holds exactly the request's prompt prefix + fed outputs
            assert seq.conv.num_cells == q.progress
            assert seq.conv.token_ids == q.stream[: q.progress]
            assert seq.pending is None or q.pending

    def every_cell_holds_its_conversations_history(self):
        c = self.CHUNK
        for conv in self.s.cache:
            for p in range(conv.num_cells):
                cell = (conv.table.chunk_ids[p // c], p % c)
                assert self.kv.get(cell) == tuple(conv.token_ids[: p + 1]), (conv.conv_id, p)

    def teardown(self):
        s = self.s
        for request_id in [r for r, *_ in s.waiting] + list(s.seqs):
            assert s.abort(request_id)
        assert not s.has_work
        s.clear_cache()
        check_scheduler(s)
        assert len(s.cache) == 0
        assert all(lane.conv is None and lane.seq is None for lane in s.lanes)
        if self.POOLED:
            assert s.layout.pool.num_free == s.layout.pool.num_total
            assert all(s.layout.pool.refcount(i) == 0 for i in range(s.layout.pool.num_total))
        else:
            assert all(t.num_cells == 0 for t in s.layout.lane_tables)


SETTINGS = settings(
    max_examples=300, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class PooledMachine(SchedulerMachine):
    pass


class PooledTinyChunksMachine(SchedulerMachine):
    CHUNK = 2
    NUM_CHUNKS = 10
    MAX_CONTEXT = 12
    PREFILL = 3


class PooledSharingMachine(SchedulerMachine):
    """Room and lanes enough that prefixes are shared more often than the pool fills."""

    NUM_LANES = 4
    NUM_CHUNKS = 16


class ReservedMachine(SchedulerMachine):
    POOLED = False


TestPooled = PooledMachine.TestCase
TestPooled.settings = SETTINGS
TestPooledTinyChunks = PooledTinyChunksMachine.TestCase
TestPooledTinyChunks.settings = settings(SETTINGS, max_examples=150)
TestPooledSharing = PooledSharingMachine.TestCase
TestPooledSharing.settings = settings(SETTINGS, max_examples=150)
TestReserved = ReservedMachine.TestCase
TestReserved.settings = settings(SETTINGS, max_examples=150)

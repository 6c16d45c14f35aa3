"""The scheduler: admission, lanes, growth, eviction and truncation. Imports no torch.

A step is a transaction: `schedule` plans it, the runner executes it, and `commit`
records what was computed (the cells written, the tokens sampled); if the execute
fails, `fail` ends exactly the requests the step carried instead. Planning holds room
(chunks) and decides admissions, refusals and truncations, but never advances a
conversation: a conversation claims a cell only once its K/V is written.

Every step it (1) grows the tables of decoding lanes by one cell, making room in the
order DESIGN.md gives (idle conversations give way LRU first; then the youngest lane
that cannot grow ends, truncated), (2) admits waiting requests into free lanes with
the room left (or refuses one the pool cannot hold), and (3) lists the tokens each
lane feeds: one per decoding lane, and prompt pieces of at most `prefill_chunk`
tokens in all, so long prompts are read between decode steps.
"""

from __future__ import annotations

from collections import deque

from strata.engine.admission import (
    AdmissionPlan,
    Blocked,
    NoRoom,
    Reuse,
    choose_victims,
    plan_admission,
)
from strata.drafting.planner import DraftPlanner
from strata.engine.cache import ConversationCache
from strata.engine.conversation import Conversation, Sequence
from strata.engine.dedup import adopt_identical_chunks
from strata.engine.holds import SessionHolds
from strata.engine.invariants import check_invariants
from strata.engine.lanes import Lanes
from strata.engine.stats import PoolCounters, PoolStats, pool_stats
from strata.engine.window_room import grow_step_windows, make_window_room
from strata.engine.work import build_work, commit_work
from strata.kv.layout import KVLayout
from strata.kv.table import CellCopy
from strata.step import Admission, Refusal, StepOutput, StepPlan


class Scheduler:
    """`drafts`: the draft planner when the engine drafts (`--spec`), planned after admissions."""

    def __init__(self, layout: KVLayout, num_lanes: int, max_context: int, prefill_chunk: int,
                 prefill_alone: int | None = None, drafts: DraftPlanner | None = None):
        self.layout = layout
        self.cache = ConversationCache()
        self.counters = PoolCounters()
        self.lanes = Lanes(num_lanes, layout, self.cache, self.counters, max_context)
        self.holds = SessionHolds(self.lanes)  # session files in flight (engine/holds.py)
        self.max_context = max_context
        self.prefill_chunk = prefill_chunk
        self.prefill_alone = prefill_alone
        self.drafts = drafts
        self.waiting: deque[tuple[str, list[int], int]] = deque()  # (request id, prompt, target cells)
        self.seqs: dict[str, Sequence] = {}
        self._num_admitted = 0
        # Waiting requests the last plan left waiting for a session file in flight (a restore
        # they extend, or a lane it holds); `unblock` when one ends.
        self._blocked: frozenset[str] = frozenset()

    # ---- requests in and out -------------------------------------------------------
    def add(self, request_id: str, prompt_ids: list[int], max_new: int | None = None) -> None:
        """Queue a request; `max_new` (None: up to --max-context) sizes its ring, if any."""
        assert 0 < len(prompt_ids) < self.max_context, "the engine validates prompt length"
        target = self.max_context if max_new is None else min(self.max_context, len(prompt_ids) + max_new)
        self.waiting.append((request_id, list(prompt_ids), target))

    def commit(self, plan: StepPlan, output: StepOutput) -> dict[str, bool]:
        """The runner executed `plan`: its cells are written and `output` sampled. Returns,
        per sampled request, whether its token can be fed (False: the context is full)."""
        outcomes = {o.request_id: o for o in output.drafts}
        commit_work(self.seqs, plan.work, self.lanes, outcomes)
        self.counters.num_chunks_adopted += adopt_identical_chunks(self.seqs, plan.work, self.lanes)
        if self.drafts is not None:
            self.drafts.record(self.seqs, output.drafts, plan.work)
        can_continue = {}
        for s in output.sampled:
            seq = self.seqs[s.request_id]
            seq.pending = s.token_id
            seq.num_output += 1
            can_continue[s.request_id] = seq.conv.num_cells + 1 <= self.max_context
        return can_continue

    def fail(self, plan: StepPlan) -> tuple[str, ...]:
        """The runner failed on `plan`: end the requests it carried and give back their room.

        Nothing of the step was committed, so every conversation still claims only cells
        written by earlier steps. A request whose table received copies this step (a fork's
        partial chunk, a reserved move, a copy-on-write) may hold cells half copied: its
        conversation is dropped. Any other follow-up goes back to the conversation it
        found, which stays cached; a new conversation is dropped. Parked conversations and
        requests the step did not carry are untouched.
        """
        self.counters.num_failed_steps += 1
        copied = {a.request_id for a in plan.admitted if a.has_copies}
        ended = []
        for request_id in plan.request_ids:
            seq = self.seqs.get(request_id)
            if seq is None:
                continue
            if request_id in copied:
                del self.seqs[request_id]
                self.lanes[seq.lane].seq = None
                self.lanes.drop(seq.conv)
            else:
                self.abort(request_id)
            ended.append(request_id)
        return tuple(ended)

    def finish(self, request_id: str) -> None:
        """The request is done: its conversation stays cached, idle in its lane, holding
        only the chunks its cells use (room grown for tokens never fed goes back)."""
        seq = self.seqs.pop(request_id)
        self.lanes[seq.lane].seq = None
        conv = seq.conv
        copies = self.layout.truncate(conv.table, conv.num_cells)
        assert not copies  # the chunk an active conversation writes is private
        self.cache.deactivate(conv)

    def abort(self, request_id: str) -> bool:
        """Cancel a waiting or running request; a running one gives its chunks back.

        A follow-up that extended a cached conversation gives back only what it added:
        the conversation is cut back to where the request found it and stays cached.
        """
        for item in self.waiting:
            if item[0] == request_id:
                self.waiting.remove(item)
                return True
        seq = self.seqs.pop(request_id, None)
        if seq is None:
            return False
        self.lanes[seq.lane].seq = None
        conv = seq.conv
        if (seq.is_extension and self.layout.num_chunks_to_truncate(conv.table, seq.num_cached) == 0
                and not any(self.layout.num_window_chunks_to_truncate(conv.table, seq.num_cached))
                and self.layout.windows_held(conv.table, seq.num_cached)):
            copies = self.layout.truncate(conv.table, seq.num_cached)
            assert not copies
            self.cache.cut(conv, seq.num_cached)
            self.cache.deactivate(conv)
        else:
            self.lanes.drop(conv)
        return True

    # ---- one step -------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        copies: list[CellCopy] = []
        admitted: list[Admission] = []
        refused: list[Refusal] = []
        # Decoding lanes grow first: a new request is refused (or waits) before it can take
        # the room a running lane needs this step and end it (DESIGN.md: pool full order).
        truncated = self._grow_decoding()
        kept: deque[tuple[str, list[int], int]] = deque()
        blocked: list[str] = []
        while self.waiting:
            item = self.waiting.popleft()
            request_id, prompt_ids, target_cells = item
            if self.holds.waits_for_restore(prompt_ids):
                plan = Blocked(None)
            else:
                plan = plan_admission(prompt_ids, self.lanes)
            if plan is None:
                kept.append(item)
                break  # every lane is busy: wait
            if isinstance(plan, Blocked):
                kept.append(item)  # it waits for a session file; requests behind it go on
                blocked.append(request_id)
                continue
            if isinstance(plan, NoRoom):
                self.counters.num_refusals += 1
                refused.append(Refusal(request_id, plan.num_chunks_needed, plan.num_chunks_free))
                continue
            admission_copies = self._admit(request_id, prompt_ids, plan, target_cells)
            copies += admission_copies
            admitted.append(Admission(request_id, plan.lane, plan.num_cached, bool(admission_copies)))
        kept.extend(self.waiting)
        self.waiting = kept
        self._blocked = frozenset(blocked)
        if self.drafts is not None:  # optional work: after admissions, from free chunks only
            self.drafts.plan(self.seqs.values())
        work = build_work(self.seqs.values(), self.prefill_chunk, self.prefill_alone, self.drafts)
        work = grow_step_windows(work, self.seqs, self.lanes)
        busy = tuple(sorted(s.lane for s in self.seqs.values()))
        return StepPlan(tuple(copies), work, tuple(admitted), tuple(refused), truncated, busy)

    def _admit(self, request_id: str, prompt_ids: list[int], plan: AdmissionPlan,
               target_cells: int = 0) -> list[CellCopy]:
        self.lanes.evict(plan.victims)
        lane = self.lanes[plan.lane]
        source = plan.source
        if lane.conv is not None and not (plan.reuse is Reuse.EXTEND and lane.conv is source):
            self.lanes.displace(lane)  # a fork from the lane's own conversation parks the original
        copies: list[CellCopy] = []
        if plan.reuse is Reuse.EXTEND:
            conv = source
            if conv.lane != lane.index:
                copies += self.lanes.place(conv, lane.index)
            # A branch in place; or the partial last chunk is shared with a save in flight, and
            # the conversation writes into a private copy of it (engine/holds.py).
            if plan.num_cached < conv.num_cells or self.layout.num_chunks_to_truncate(conv.table, plan.num_cached):
                make_window_room(self.lanes, self.layout.num_window_chunks_to_truncate(conv.table, plan.num_cached),
                                 ((conv, plan.num_cached),))
                copies += self.layout.truncate(conv.table, plan.num_cached)
                self.cache.cut(conv, plan.num_cached)
        elif plan.reuse is Reuse.FORK:
            make_window_room(self.lanes, self.layout.num_window_chunks_to_fork(source.table, plan.num_cached),
                             ((source, plan.num_cached),))
            table, fork_copies = self.layout.fork(source.table, plan.num_cached, lane.index)
            copies += fork_copies
            conv = Conversation(self.cache.new_id(), table, source.token_ids[: plan.num_cached])
            conv.checkpoints = [c for c in source.checkpoints if c <= plan.num_cached]
            conv.draft_cells = min(source.draft_cells, plan.num_cached)  # shared chunks carry it
            self.cache.add(conv)
        else:
            conv = Conversation(self.cache.new_id(), self.layout.new_table(lane.index))
            self.cache.add(conv)
        self.counters.num_cells_copied += sum(c.num_cells for c in copies)
        self.layout.grow(conv.table, len(prompt_ids) + 1)  # the prompt and its first decoded token
        conv.lane = lane.index
        conv.add_checkpoint(plan.num_cached)
        # the windows a branch from this turn or a regenerate of it goes on from (kv/window_table.py)
        self.layout.keep_windows(conv.table, (plan.num_cached, len(prompt_ids) - 1))
        self.cache.activate(conv)
        lane.conv = conv
        self._num_admitted += 1
        seq = Sequence(request_id, prompt_ids, self._num_admitted, lane.index, conv, plan.num_cached,
                       is_extension=plan.reuse is Reuse.EXTEND, target_cells=target_cells)
        lane.seq = seq
        self.seqs[request_id] = seq
        self.counters.num_cached_tokens += plan.num_cached
        return copies

    def _grow_decoding(self) -> tuple[str, ...]:
        """Room for one more cell in every decoding lane; ends the youngest that cannot grow."""
        needs = {
            seq: self.layout.num_chunks_to_grow(seq.conv.table, seq.conv.num_cells + 1)
            for seq in self.seqs.values()
            if seq.pending is not None
        }
        truncated: list[str] = []
        while (deficit := sum(needs.values()) - self.layout.pool.num_free) > 0:
            victims = choose_victims(self.lanes, deficit)
            if victims is not None:
                self.lanes.evict(victims)
                break
            youngest = max((s for s, n in needs.items() if n > 0), key=lambda s: s.order)
            del needs[youngest]
            del self.seqs[youngest.request_id]
            self.lanes[youngest.lane].seq = None
            self.lanes.drop(youngest.conv)
            self.counters.num_truncations += 1
            truncated.append(youngest.request_id)
        for seq in sorted(needs, key=lambda s: s.order):
            self.layout.grow(seq.conv.table, seq.conv.num_cells + 1)
        return tuple(truncated)

    # ---- conversations between lanes (engine/lanes.py) ------------------------------------
    def move(self, src_lane: int, dst_lane: int) -> list[CellCopy]:
        """Move the idle conversation of `src_lane` to `dst_lane` (swap, or copy when reserved)."""
        return self.lanes.move(src_lane, dst_lane)

    def park(self, lane_index: int) -> None:
        self.lanes.park(lane_index)

    def erase(self, lane_index: int) -> int:
        return self.lanes.erase(lane_index)

    def restore(self, token_ids: list[int], checkpoints: list[int], lane_index: int | None = None) -> Conversation | None:
        return self.lanes.restore(token_ids, checkpoints, lane_index)

    def clear_cache(self) -> None:
        """Evict every idle conversation."""
        self.lanes.clear_cache()

    def replace_cache(self, cache: ConversationCache) -> None:
        """Hold conversations in `cache` from now on (benchmarks compare cache kinds); the
        current cache must hold none (clear_cache first, with no request running)."""
        assert not self.seqs and len(self.cache) == 0, "replace_cache with conversations held"
        self.cache = self.lanes.cache = cache

    # ---- views ----------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        """A request is running, or one waits that is not waiting for a session file."""
        return bool(self.seqs) or any(item[0] not in self._blocked for item in self.waiting)

    def unblock(self) -> None:
        """A session file ended: the requests waiting for one are planned again next step."""
        self._blocked = frozenset()

    def stats(self) -> PoolStats:
        return pool_stats(self.lanes, self.holds)

    def check(self) -> None:
        """Every invariant of lanes, conversations and the pool (tests call it after each step)."""
        check_invariants(self.lanes, self.seqs, self.holds)

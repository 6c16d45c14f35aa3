"""The lanes and the conversations they hold: placing, moving, parking, erasing and restoring.

Every conversation enters a lane and leaves it through here, and every conversation that
is dropped is dropped here (its table released, its cache entry removed), so lanes,
cache and layout always agree. Whether a conversation that leaves its lane survives is
the layout's to say: one that can be held without a lane (`holds_parked`, the pool) is
parked, one that lives in its lane's reservation is evicted.

A restore (session files, synthetic K/V) takes three moves so that a file can be
streamed between them and a failure undone: `plan_restore` changes nothing;
`take_restore` evicts what the plan names and takes the room, in no conversation yet
(`drop_restore` gives it back); `finish_restore` makes it a held conversation. Only
`take_restore` loses anything (`RestorePlan.loses_conversations`). No torch here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from strata.engine.admission import RestorePlan, choose_victims, pick_lane
from strata.engine.cache import ConversationCache
from strata.engine.conversation import Conversation, Lane
from strata.engine.stats import PoolCounters
from strata.engine.window_room import make_window_room, plan_restore_windows
from strata.kv.layout import KVLayout
from strata.kv.table import CellCopy, ChunkTable


class Lanes:
    def __init__(self, num_lanes: int, layout: KVLayout, cache: ConversationCache, counters: PoolCounters,
                 max_context: int):
        self.lanes = [Lane(i) for i in range(num_lanes)]
        self.layout = layout
        self.cache = cache
        self.counters = counters
        self.max_context = max_context

    def __getitem__(self, index: int) -> Lane:
        return self.lanes[index]

    def __iter__(self) -> Iterator[Lane]:
        return iter(self.lanes)

    def __len__(self) -> int:
        return len(self.lanes)

    # ---- conversations in and out of lanes ----------------------------------------------
    def place(self, conv: Conversation, dst_lane: int) -> list[CellCopy]:
        """Put `conv` in the empty lane `dst_lane`, from its own lane or from the pool."""
        table, copies = self.layout.move(conv.table, dst_lane)
        if conv.lane is not None:
            if conv.lane != dst_lane:
                if self.layout.moves_copy:
                    self.counters.num_moves_copy += 1
                else:
                    self.counters.num_moves_swap += 1
            self.lanes[conv.lane].conv = None
        conv.table, conv.lane = table, dst_lane
        self.lanes[dst_lane].conv = conv
        return copies

    def displace(self, lane: Lane) -> None:
        """An idle conversation leaves its lane: parked, or evicted where the layout cannot hold
        it without a lane."""
        conv = lane.conv
        assert conv is not None and not conv.is_active
        if self.layout.holds_parked:
            lane.conv, conv.lane = None, None
        else:
            self.evict((conv,))

    def evict(self, victims: tuple[Conversation, ...]) -> None:
        for conv in victims:
            assert not conv.is_active
            self.drop(conv)
            self.counters.num_evictions += 1

    def drop(self, conv: Conversation) -> None:
        if conv.lane is not None:
            self.lanes[conv.lane].conv = None
        self.layout.release(conv.table)
        self.cache.remove(conv)

    def move(self, src_lane: int, dst_lane: int) -> list[CellCopy]:
        """Move the idle conversation of `src_lane` to `dst_lane` (a swap, or a copy when reserved)."""
        src, dst = self.lanes[src_lane], self.lanes[dst_lane]
        if not src.is_idle:
            raise ValueError(f"lane {src_lane} holds no idle conversation")
        if dst.is_busy:
            raise ValueError(f"lane {dst_lane} is busy")
        if src.is_pinned or dst.is_pinned:
            raise ValueError(f"lane {src_lane if src.is_pinned else dst_lane} is held by a session file in flight")
        if src_lane == dst_lane:
            return []  # already there (displacing dst would take the conversation itself out)
        if dst.conv is not None:
            self.displace(dst)
        copies = self.place(src.conv, dst_lane)
        self.counters.num_cells_copied += sum(c.num_cells for c in copies)
        return copies

    def park(self, lane_index: int) -> None:
        """Take the idle conversation out of its lane, keeping its K/V held.

        Where a conversation lives in its lane's reservation it is already parked there,
        so this changes nothing."""
        lane = self.lanes[lane_index]
        if not lane.is_idle:
            raise ValueError(f"lane {lane_index} holds no idle conversation")
        if self.layout.holds_parked:
            self.displace(lane)

    def erase(self, lane_index: int) -> int:
        """Drops the idle conversation in a lane (its chunks go back); returns its cells (0: none)."""
        lane = self.lanes[lane_index]
        if lane.is_busy:
            raise ValueError(f"lane {lane_index} is busy")
        if lane.conv is None:
            return 0
        num_cells = lane.conv.num_cells
        self.evict((lane.conv,))
        return num_cells

    def clear_cache(self) -> None:
        """Evict every idle conversation."""
        self.evict(tuple(self.cache.idle_lru()))

    # ---- restores -------------------------------------------------------------------------
    def restore(self, token_ids: list[int], checkpoints: list[int], lane_index: int | None = None) -> Conversation | None:
        """Hold a conversation whose K/V the caller writes next (synthetic K/V): `plan_restore`,
        `take_restore` and `finish_restore` at once; None when there is no room (nothing changed).
        Windowed groups keep the windows before `checkpoints` as room allows."""
        n = len(token_ids)
        plan = self.plan_restore(n, lane_index, [c for c in checkpoints if 0 < c < n])
        if plan is None:
            return None
        return self.finish_restore(plan, self.take_restore(plan), token_ids, checkpoints)

    def plan_restore(self, num_cells: int, lane_index: int | None = None, kept: Sequence[int] = ()
                     ) -> RestorePlan | None:
        """Where a restored conversation of `num_cells` goes and who gives way (nothing changes).

        It goes into `lane_index` (displacing an idle conversation), or is parked without a
        lane where the layout holds parked conversations (else a lane is picked). Idle
        conversations give way as for a new request; None when even that leaves no room. In
        the windowed groups it holds its last window and the windows before `kept` (ascending)
        that room allows (engine/window_room.py's `plan_restore_windows`).
        """
        assert 0 < num_cells <= self.max_context
        if lane_index is None and not self.layout.holds_parked:
            lane = pick_lane(self.lanes)
            if lane is None:
                return None
            lane_index = lane.index
        if lane_index is not None and self.lanes[lane_index].is_busy:
            raise ValueError(f"lane {lane_index} is busy")
        need = self.layout.num_chunks_to_grow_from(0, num_cells)
        victims = choose_victims(self, need - self.layout.pool.num_free)
        if victims is None:
            return None
        windows = plan_restore_windows(self, num_cells, kept, victims)
        if windows is None:
            return None
        kept, more, drops = windows
        displaced = self.lanes[lane_index].conv if lane_index is not None else None
        return RestorePlan(num_cells, lane_index, victims + more, displaced, self.layout.holds_parked, kept, drops)

    def take_restore(self, plan: RestorePlan) -> ChunkTable:
        """Evicts `plan`'s victims (and, where conversations cannot be parked, the lane's idle
        one) and returns a table holding room for its cells, in no conversation yet:
        `finish_restore` adopts it, `drop_restore` gives it back. Windowed groups hold the last
        window and the windows before `plan.kept` (kept, as a conversation's are)."""
        self.evict(plan.victims)
        lane = self.lanes[plan.lane] if plan.lane is not None else None
        if lane is not None and lane.conv is not None and not self.layout.holds_parked:
            self.displace(lane)
        table = self.layout.new_table(plan.lane if plan.lane is not None else -1)
        self.layout.grow(table, plan.num_cells)
        self.layout.keep_windows_ahead(table, list(plan.kept))
        make_window_room(self, self.layout.num_window_chunks_to_grow(table, plan.num_cells, plan.num_cells))
        self.layout.grow_windows(table, plan.num_cells, plan.num_cells)  # the last window only
        table.append_cells(plan.num_cells)
        return table

    def drop_restore(self, table: ChunkTable) -> None:
        self.layout.release(table)

    def finish_restore(
        self, plan: RestorePlan, table: ChunkTable, token_ids: list[int], checkpoints: list[int]
    ) -> Conversation:
        """`table`'s K/V is written: a conversation holds it, in `plan.lane` or parked."""
        assert len(token_ids) == table.num_cells == plan.num_cells
        lane = self.lanes[plan.lane] if plan.lane is not None else None
        if lane is not None and lane.conv is not None:
            self.displace(lane)  # parked now, once nothing can fail any more
        conv = Conversation(self.cache.new_id(), table, list(token_ids), sorted(set(checkpoints)), plan.lane)
        self.cache.add(conv)
        if lane is not None:
            lane.conv = conv
        return conv

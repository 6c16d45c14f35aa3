"""Restoring a conversation whose K/V comes from outside a step (session files, synthetic K/V).

A mixin of the Scheduler (it uses the scheduler's lanes, layout, cache and its eviction), in
three moves so that a session file can be streamed between them and a failure undone:
`plan_restore` changes nothing; `take_restore` evicts what the plan names and takes the
room, in no conversation yet (`drop_restore` gives it back); `finish_restore` makes it a
held conversation. Only `take_restore` loses anything (`RestorePlan.loses_conversations`).
"""

from __future__ import annotations

from strata.engine.admission import RestorePlan, choose_victims, pick_lane
from strata.engine.conversation import Conversation
from strata.kv.table import ChunkTable


class Restores:
    def restore(self, token_ids: list[int], checkpoints: list[int], lane_index: int | None = None) -> Conversation | None:
        """Hold a conversation whose K/V the caller writes next (synthetic K/V): `plan_restore`,
        `take_restore` and `finish_restore` at once; None when there is no room (nothing changed)."""
        plan = self.plan_restore(len(token_ids), lane_index)
        if plan is None:
            return None
        return self.finish_restore(plan, self.take_restore(plan), token_ids, checkpoints)

    def plan_restore(self, num_cells: int, lane_index: int | None = None) -> RestorePlan | None:
        """Where a restored conversation of `num_cells` goes and who gives way (nothing changes).

        It goes into `lane_index` (displacing an idle conversation), or is parked without a
        lane (pooled only; reserved picks a lane). Idle conversations give way as for a new
        request; None when even that leaves no room.
        """
        assert 0 < num_cells <= self.max_context
        if lane_index is None and not self.layout.is_pooled:
            lane = pick_lane(self.lanes)
            if lane is None:
                return None
            lane_index = lane.index
        if lane_index is not None and self.lanes[lane_index].is_busy:
            raise ValueError(f"lane {lane_index} is busy")
        need = self.layout.num_chunks_to_grow_from(0, num_cells)
        victims = choose_victims(self.cache, self.layout, need - self.layout.pool.num_free)
        if victims is None:
            return None
        displaced = self.lanes[lane_index].conv if lane_index is not None else None
        return RestorePlan(num_cells, lane_index, victims, displaced, self.layout.is_pooled)

    def take_restore(self, plan: RestorePlan) -> ChunkTable:
        """Evicts `plan`'s victims (and, reserved, the lane's idle conversation) and returns a
        table holding room for its cells, in no conversation yet: `finish_restore` adopts it,
        `drop_restore` gives it back."""
        self._evict(plan.victims)
        lane = self.lanes[plan.lane] if plan.lane is not None else None
        if lane is not None and lane.conv is not None and not self.layout.is_pooled:
            self._displace(lane)
        table = self.layout.new_table(plan.lane if plan.lane is not None else -1)
        self.layout.grow(table, plan.num_cells)
        table.num_cells = plan.num_cells
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
            self._displace(lane)  # pooled: parked now, once nothing can fail any more
        conv = Conversation(self.cache.new_id(), table, list(token_ids), sorted(set(checkpoints)), plan.lane)
        self.cache.add(conv)
        if lane is not None:
            lane.conv = conv
        return conv

    def erase(self, lane_index: int) -> int:
        """Drops the idle conversation in a lane (its chunks go back); returns its cells (0: none)."""
        lane = self.lanes[lane_index]
        if lane.is_busy:
            raise ValueError(f"lane {lane_index} is busy")
        if lane.conv is None:
            return 0
        num_cells = lane.conv.num_cells
        self._evict((lane.conv,))
        return num_cells

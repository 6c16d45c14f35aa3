"""What session files in flight hold while their bytes stream on a worker thread. No torch.

A save holds a snapshot of its conversation's chunk table: positions [0, n) and the chunks
that hold them, in every layer group (a windowed group's: the chunks of the window before n
and of the kept windows the file holds, kv/window_table.py's `snapshot`). Where chunks can
be shared (the pool) the save takes one more holder on each (pool refcounts), so the
conversation may go on meanwhile: a follow-up that extends it copies the shared partial last
chunk into a private one before writing (copy-on-write at admission, as a fork does, in every
group), full chunks are never written again, a windowed chunk the conversation passes stays
held by the save, and a conversation that is evicted leaves its chunks held by the save
until it ends. Where conversations live in
their lane's reservation (no sharing), the save pins the lane instead: no request is placed
in it, and a follow-up of its conversation waits, until the save ends.

A restore pins the lane it goes into (if any) from the start, and takes its room up front
(`take`: a table held by no conversation, so no step reads or writes its cells); only when
every record is in and checked does `finish` make it a conversation. A request that shares
more of its prompt with a conversation being restored than with any held one (at least half
of the restoring one) waits for it; an erase of its lane wins (`drop_lane`): the restore is
marked dropped and its room goes back once the worker has stopped writing into it.

Invariants (`check`, with the scheduler's): a chunk a save or a restore holds counts as
held, so a chunk's refcount is the number of conversations' tables plus holds listing it and
free + held == total; every pinned lane names a hold in flight and every hold's lane is
pinned by it; a restore's table, once taken, covers its cells.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from strata.engine.admission import RestorePlan
from strata.engine.conversation import Conversation
from strata.engine.lanes import Lanes
from strata.engine.prefix_index import common_prefix_len
from strata.kv import window_table as wt
from strata.kv.table import ChunkTable, chunks_for


@dataclass(eq=False)
class SaveHold:
    hold_id: int
    table: ChunkTable  # the snapshot: positions [0, num_cells) in these chunks
    shared: bool  # the save holds a share of each chunk (else its lane is pinned)
    lane: int | None  # the pinned lane (not shared), else None


@dataclass(eq=False)
class RestoreHold:
    hold_id: int
    token_ids: list[int]
    checkpoints: list[int]
    lane: int | None  # the lane it goes into, pinned; None: parked without a lane
    kept: list[int] = field(default_factory=list)  # positions whose windows it keeps, room allowing
    table: ChunkTable | None = None  # the room, once taken (held by no conversation)
    plan: RestorePlan | None = None  # the plan the room was taken by
    dropped: bool = False  # an erase of its lane won

    @property
    def num_cells(self) -> int:
        return len(self.token_ids)


@dataclass
class SessionHolds:
    lanes: Lanes
    saves: dict[int, SaveHold] = field(default_factory=dict)
    restores: dict[int, RestoreHold] = field(default_factory=dict)
    _next_id: int = 0

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _pin(self, lane: int | None, hold_id: int) -> None:
        if lane is not None:
            assert not self.lanes[lane].is_pinned and not self.lanes[lane].is_busy
            self.lanes[lane].pinned_by = hold_id

    def _unpin(self, lane: int | None, hold_id: int) -> None:
        if lane is not None:
            assert self.lanes[lane].pinned_by == hold_id
            self.lanes[lane].pinned_by = None

    # ---- saves ------------------------------------------------------------------------------
    def hold_save(self, conv: Conversation, num_cells: int, kept: Sequence[int] = ()) -> SaveHold:
        """Holds the first `num_cells` positions of the idle `conv` for a save (see the module doc),
        in the windowed groups the windows before `num_cells` and before `kept` (held)."""
        assert not conv.is_active and 0 < num_cells <= conv.num_cells
        layout = self.lanes.layout
        ids = conv.table.chunk_ids[: chunks_for(num_cells, layout.chunk_size)]
        hold = SaveHold(self._new_id(), ChunkTable(list(ids), num_cells), layout.shares_chunks,
                        None if layout.shares_chunks else conv.lane)
        if hold.shared:
            layout.pool.share(ids)
            hold.table.windows = [wt.snapshot(w, num_cells, list(kept)) for w in conv.table.windows]
        else:
            self._pin(hold.lane, hold.hold_id)
        self.saves[hold.hold_id] = hold
        return hold

    def release_save(self, hold: SaveHold) -> None:
        del self.saves[hold.hold_id]
        if hold.shared:
            self.lanes.layout.pool.release(hold.table.chunk_ids)
            for w in hold.table.windows:
                wt.release(w)
        else:
            self._unpin(hold.lane, hold.hold_id)

    # ---- restores ---------------------------------------------------------------------------
    def begin_restore(self, token_ids: list[int], checkpoints: list[int], lane: int | None,
                      kept: Sequence[int] = ()) -> RestoreHold:
        hold = RestoreHold(self._new_id(), list(token_ids), list(checkpoints), lane, list(kept))
        self._pin(lane, hold.hold_id)
        self.restores[hold.hold_id] = hold
        return hold

    def plan_restore(self, hold: RestoreHold) -> RestorePlan | None:
        """Where the restore goes and who gives way now (nothing changes); None: no room."""
        return self.lanes.plan_restore(hold.num_cells, hold.lane, hold.kept)

    def take(self, hold: RestoreHold, plan: RestorePlan) -> ChunkTable:
        """Evicts `plan`'s victims and takes the room; the cells are the worker's to write."""
        assert hold.table is None and not hold.dropped
        hold.plan, hold.table = plan, self.lanes.take_restore(plan)
        return hold.table

    def finish(self, hold: RestoreHold) -> Conversation:
        """Every record is in and checked: the conversation is held, idle, in its lane or parked."""
        assert hold.table is not None and hold.plan is not None and not hold.dropped
        del self.restores[hold.hold_id]
        self._unpin(hold.lane, hold.hold_id)
        return self.lanes.finish_restore(hold.plan, hold.table, hold.token_ids, hold.checkpoints)

    def drop(self, hold: RestoreHold) -> None:
        """The restore failed or was dropped, and no worker writes into its room any more."""
        del self.restores[hold.hold_id]
        self._unpin(hold.lane, hold.hold_id)
        if hold.table is not None:
            self.lanes.drop_restore(hold.table)

    def drop_lane(self, lane: int) -> RestoreHold | None:
        """An erase of `lane` wins over the restore into it: marked dropped (its room goes back
        in `drop`, when its worker has stopped); None when no restore goes there."""
        for hold in self.restores.values():
            if hold.lane == lane and not hold.dropped:
                hold.dropped = True
                return hold
        return None

    def waits_for_restore(self, prompt_ids: list[int]) -> bool:
        """The request should wait for a restore in flight (the module doc says when)."""
        live = [h for h in self.restores.values() if not h.dropped]
        if not live:
            return False
        held = self.lanes.cache.longest_prefix(prompt_ids)[1]
        return any(2 * (n := common_prefix_len(h.token_ids, prompt_ids)) >= h.num_cells and n > held
                   for h in live)

    # ---- views ------------------------------------------------------------------------------
    def tables(self) -> Iterator[ChunkTable]:
        """The tables whose chunks holds keep held (pooled saves' snapshots, restores' room)."""
        yield from (h.table for h in self.saves.values() if h.shared)
        yield from (h.table for h in self.restores.values() if h.table is not None)

    def __len__(self) -> int:
        return len(self.saves) + len(self.restores)

    def check(self) -> None:
        pins = {h.hold_id: h.lane for h in [*self.saves.values(), *self.restores.values()] if h.lane is not None}
        for lane in self.lanes:
            if lane.is_pinned:
                assert pins.get(lane.pinned_by) == lane.index, f"lane {lane.index} pinned by a hold not in flight"
        for hold_id, index in pins.items():
            assert self.lanes[index].pinned_by == hold_id, f"hold {hold_id}'s lane {index} is not pinned by it"
        size = self.lanes.layout.chunk_size
        for table in self.tables():
            assert table.num_cells <= table.cell_capacity(size)

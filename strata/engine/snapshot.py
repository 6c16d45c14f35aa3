"""A frozen view of the engine (pool, lanes, counters): `Engine.snapshot()`.

The engine is not thread-safe, so /metrics and /slots never read it: the thread that steps
it builds a new `EngineSnapshot` after every step (and after queued adds and aborts) and
swaps it in with one reference assignment; HTTP handlers read whichever one is current.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from strata.cells.ring_groups import GroupedRing
from strata.drafting.planner import SpecCounters
from strata.engine.conversation import Sequence
from strata.engine.scheduler import Scheduler
from strata.engine.stats import PoolCounters, PoolStats


@dataclass(frozen=True)
class LaneView:
    index: int
    state: str  # "empty" | "idle" (a cached conversation, no request) | "prefilling" | "decoding"
    num_cells: int  # cells of the lane's conversation
    num_chunks: int  # chunks the lane holds (its reservation in the reserved layout)
    request_id: str | None
    num_prompt_tokens: int | None
    num_output_tokens: int | None
    num_chunks_shared: int = 0  # of its chunks, those another conversation holds too (a shared prefix)
    ring: dict | None = None  # --kv-resident: the lane's ring (GroupedRing.lane_stats), for its last request
    spec: dict | None = None  # --spec: the running request's drafts (drafted, accepted, acceptance, k)


@dataclass(frozen=True)
class EngineSnapshot:
    pool: PoolStats
    counters: PoolCounters  # a copy: the engine's own object keeps changing
    num_chunks_active: int  # chunks in the tables of running requests (parked ones excluded)
    num_running: int
    num_queued: int  # added to the engine, waiting for a lane
    lanes: tuple[LaneView, ...]
    retry_after: int  # the engine's current hint, in seconds
    max_context: int
    bytes_per_cell: int  # K and V of one position across all layers
    ring: dict | None = None  # --kv-resident: the ring's counters (GroupedRing.stats)
    spec: SpecCounters | None = None  # --spec: drafts over every request (a copy)
    moe: dict | None = None  # --moe-resident / --device-memory: the expert cache's counters (CachedBank.stats)
    # With layer groups: K and V of one position in each group's layers (the full group's first)
    group_bytes_per_cell: tuple[int, ...] = ()
    group_layers: tuple[int, ...] = ()  # with layer groups: each group's number of layers (the full group's first)

    @property
    def usage_ratio(self) -> float:
        total = self.pool.num_chunks_total
        return self.pool.num_chunks_held / total if total else 0.0

    @property
    def kv_bytes_held(self) -> int:
        """K/V bytes of every held chunk (all layers; each layer group's chunks hold its own layers)."""
        if not self.group_bytes_per_cell:
            return self.pool.num_chunks_held * self.pool.chunk_size * self.bytes_per_cell
        held = (self.pool.num_chunks_held, *(g.num_chunks_held for g in self.pool.groups))
        return sum(n * b for n, b in zip(held, self.group_bytes_per_cell)) * self.pool.chunk_size


def take_snapshot(scheduler: Scheduler, ring: GroupedRing | None, retry_after: int, bytes_per_cell: int,
                  bank=None, group_bytes_per_cell: tuple[int, ...] = (),
                  group_layers: tuple[int, ...] = ()) -> EngineSnapshot:
    """Call where the scheduler is not changing (the thread that steps the engine)."""
    stats = scheduler.stats()
    active: set[int] = set()
    lanes = []
    for lane, num_chunks in zip(scheduler.lanes, stats.chunks_per_lane):
        seq = lane.seq
        if seq is not None:
            active.update(seq.conv.table.chunk_ids)
            state = "prefilling" if seq.is_prefilling else "decoding"
        else:
            state = "empty" if lane.conv is None else "idle"
        lanes.append(
            LaneView(
                index=lane.index,
                state=state,
                num_cells=lane.conv.num_cells if lane.conv is not None else 0,
                num_chunks=num_chunks,
                request_id=seq.request_id if seq is not None else None,
                num_prompt_tokens=len(seq.prompt_ids) if seq is not None else None,
                num_output_tokens=seq.num_output if seq is not None else None,
                num_chunks_shared=stats.shared_chunks_per_lane[lane.index] if stats.shared_chunks_per_lane else 0,
                ring=ring.lane_stats(lane.index) if ring is not None else None,
                spec=_lane_spec(seq),
            )
        )
    return EngineSnapshot(
        pool=stats,
        counters=dataclasses.replace(scheduler.counters),
        num_chunks_active=len(active),
        num_running=len(scheduler.seqs),
        num_queued=len(scheduler.waiting),
        lanes=tuple(lanes),
        retry_after=retry_after,
        max_context=scheduler.max_context,
        bytes_per_cell=bytes_per_cell,
        ring=ring.stats() if ring is not None else None,
        spec=dataclasses.replace(scheduler.drafts.counters) if scheduler.drafts is not None else None,
        moe=bank.stats() if bank is not None else None,
        group_bytes_per_cell=group_bytes_per_cell,
        group_layers=group_layers,
    )


def _lane_spec(seq: Sequence | None) -> dict | None:
    if seq is None or seq.spec is None:
        return None
    c = seq.spec.counters
    return {"drafted": c.num_drafted, "accepted": c.num_accepted,
            "acceptance": c.num_accepted / c.num_drafted if c.num_drafted else 0.0, "k": seq.spec.k.k()}

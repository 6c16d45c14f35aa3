"""What the pool holds, seen from lanes and conversations (for /metrics, /health, benchmarks)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from strata.kv import window_table as wt

if TYPE_CHECKING:
    from strata.engine.holds import SessionHolds
    from strata.engine.lanes import Lanes


@dataclass
class PoolCounters:
    """Monotonic counters of the scheduler: the pool's behaviour and failed steps (on /metrics)."""

    num_evictions: int = 0
    num_refusals: int = 0
    num_truncations: int = 0
    num_moves_swap: int = 0
    num_moves_copy: int = 0
    num_cells_copied: int = 0
    num_cached_tokens: int = 0
    num_chunks_adopted: int = 0  # full chunks computed twice at once, then held once (see engine/dedup)
    num_failed_steps: int = 0  # steps whose execute raised (their requests ended with an error)


@dataclass(frozen=True)
class GroupStats:
    """One windowed layer group's pool (kv/groups.py): its chunks hold only the group's layers."""

    window: int
    num_chunks_total: int
    num_chunks_held: int
    num_chunks_free: int
    chunks_per_lane: tuple[int, ...]  # the group's chunks each lane's conversation holds
    num_chunks_kept: int = 0  # held only for kept windows: no holder's next token reads them
    kept_per_lane: tuple[int, ...] = ()  # of each lane's chunks, those held only for its kept windows
    kept_windows_per_lane: tuple[int, ...] = ()  # positions whose window before them each lane keeps


@dataclass(frozen=True)
class PoolStats:
    num_chunks_total: int
    num_chunks_held: int
    num_chunks_free: int
    num_chunks_parked: int  # held only by idle conversations
    num_conversations_parked: int
    chunks_per_lane: tuple[int, ...]
    chunk_size: int
    num_chunks_shared: int = 0  # held by more than one conversation (a shared prefix), counted once
    num_cells_saved: int = 0  # cells sharing saves: (holders - 1) x chunk size, summed over shared chunks
    shared_chunks_per_lane: tuple[int, ...] = ()  # of each lane's chunks, the shared ones
    num_chunks_session: int = 0  # held only by session files in flight (a save's snapshot, a restore's room)
    num_sessions: int = 0  # session files in flight: saves and restores
    groups: tuple[GroupStats, ...] = ()  # the windowed layer groups; the fields above are the full group's


def pool_stats(lanes: Lanes, holds: SessionHolds | None = None) -> PoolStats:
    layout, cache = lanes.layout, lanes.cache
    in_convs = {i for c in cache for i in c.table.chunk_ids}
    session = {i for t in holds.tables() for i in t.chunk_ids} - in_convs if holds is not None else set()
    active = {i for c in cache if c.is_active for i in c.table.chunk_ids}
    holders = Counter(i for c in cache for i in c.table.chunk_ids) if layout.shares_chunks else Counter()
    shared = {i: n for i, n in holders.items() if n > 1}
    idle = {i for c in cache if not c.is_active for i in c.table.chunk_ids}
    pool = layout.pool
    return PoolStats(
        num_chunks_total=pool.num_total,
        num_chunks_held=pool.num_held,
        num_chunks_free=pool.num_free,
        num_chunks_parked=len(idle - active),
        num_conversations_parked=sum(1 for c in cache if not c.is_active),
        chunks_per_lane=tuple(
            layout.num_chunks_in_lane(lane.index, lane.conv.table if lane.conv else None) for lane in lanes
        ),
        chunk_size=pool.chunk_size,
        num_chunks_shared=len(shared),
        num_cells_saved=sum(n - 1 for n in shared.values()) * pool.chunk_size,
        shared_chunks_per_lane=tuple(
            sum(1 for i in lane.conv.table.chunk_ids if i in shared) if lane.conv else 0 for lane in lanes
        ),
        num_chunks_session=len(session) if layout.shares_chunks else 0,
        num_sessions=len(holds) if holds is not None else 0,
        groups=tuple(_group_stats(lanes, g) for g in range(len(layout.window_pools))),
    )


def _group_stats(lanes: Lanes, g: int) -> GroupStats:
    """Windowed group g + 1's pool, seen from its conversations and lanes."""
    layout, cache = lanes.layout, lanes.cache
    pool, window = layout.window_pools[g], layout.windows[g]
    held, read = set(), set()
    for c in cache:
        w = c.table.windows[g]
        first = wt.needed_from(c.num_cells, window, pool.chunk_size)
        held.update(w.held)
        read.update(i for j, i in enumerate(w.chunk_ids) if i is not None and j >= first)
    convs = [lane.conv for lane in lanes]
    return GroupStats(
        window, pool.num_total, pool.num_held, pool.num_free,
        chunks_per_lane=tuple(len(c.table.windows[g].held) if c else 0 for c in convs),
        num_chunks_kept=len(held - read),
        kept_per_lane=tuple(len(wt.kept_only(c.table.windows[g], c.num_cells)) if c else 0 for c in convs),
        kept_windows_per_lane=tuple(len(c.table.windows[g].kept) if c else 0 for c in convs),
    )

"""The pool as a picture: who holds each chunk, what each lane does, who is parked.

Taken by the engine (`Engine.picture`) on the thread that steps it, from the scheduler (no
torch), then handed to the HTTP side as a frozen value, like `snapshot.EngineSnapshot`. Chunk ownership comes from
the pool's read-only `chunk_owners` over the conversations' tables.

Invariants of a picture:
- `len(chunk_owner) == len(chunk_holders) == len(chunk_filled) == len(chunk_state) == num_chunks`;
- `chunk_owner[i]` is the oldest conversation listing chunk i (0: none), `chunk_holders[i]`
  how many list it (> 1: shared by a common prefix);
- `chunk_filled[i]` cells of chunk i hold written K/V (0..chunk_size) for its fullest holder;
- `parked` lists the idle conversations least recently used first: the order they give way.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.engine.conversation import Conversation, Lane
from strata.engine.scheduler import Scheduler

# chunk_state values (RESERVED: a lane's empty reservation; SESSION: held only by a session file in flight)
FREE, ACTIVE, PARKED, RESERVED, SESSION = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class LanePicture:
    index: int
    state: str  # "empty" | "idle" | "prefill" | "decode"
    conv_id: int  # 0: no conversation
    num_cells: int
    num_chunks: int
    request_id: str | None
    num_prompt_tokens: int  # 0 without a request
    num_output_tokens: int


@dataclass(frozen=True)
class ParkedPicture:
    conv_id: int
    num_cells: int
    num_chunks: int
    lane: int | None  # idle in a lane, or None: parked in the pool without a lane


@dataclass(frozen=True)
class PoolPicture:
    step: int  # pictures taken so far (one per engine step while watched)
    pooled: bool  # --kv-pool-tokens (False: each lane reserves its whole context)
    chunk_size: int
    num_chunks: int
    num_chunks_free: int
    chunk_owner: tuple[int, ...]
    chunk_holders: tuple[int, ...]
    chunk_filled: tuple[int, ...]
    chunk_state: tuple[int, ...]
    lanes: tuple[LanePicture, ...]
    parked: tuple[ParkedPicture, ...]
    num_queued: int
    num_running: int
    num_evictions: int
    num_refusals: int
    num_truncations: int
    max_context: int


def _filled(conv: Conversation, position: int, chunk_size: int) -> int:
    """Cells of the conversation's `position`-th chunk that hold written K/V."""
    return max(0, min(chunk_size, conv.num_cells - position * chunk_size))


def _lane_state(lane: Lane) -> str:
    if lane.seq is not None:
        return "prefill" if lane.seq.is_prefilling else "decode"
    return "empty" if lane.conv is None else "idle"


def take_picture(scheduler: Scheduler, max_context: int, step: int) -> PoolPicture:
    """Call on the engine thread only (or wherever the scheduler is not changing)."""
    layout, cache = scheduler.layout, scheduler.cache
    pool, size = layout.pool, layout.pool.chunk_size
    convs = sorted(cache, key=lambda c: c.conv_id)
    owners = pool.chunk_owners((c, c.table.chunk_ids) for c in convs)
    n = pool.num_total
    owner, holders, filled, state = [0] * n, [0] * n, [0] * n, [FREE] * n
    for chunk_id in layout.reserved_chunks():  # every lane's reservation is held, written or not
        state[chunk_id] = RESERVED
    if layout.shares_chunks:
        for table in scheduler.holds.tables():  # a save's snapshot, a restore's room
            for chunk_id in table.chunk_ids:
                state[chunk_id] = SESSION
    for conv in convs:
        for position, chunk_id in enumerate(conv.table.chunk_ids):
            filled[chunk_id] = max(filled[chunk_id], _filled(conv, position, size))
    for chunk_id, holding in owners.items():
        owner[chunk_id] = holding[0].conv_id
        holders[chunk_id] = len(holding)
        if layout.holds_parked or filled[chunk_id]:
            state[chunk_id] = ACTIVE if any(c.is_active for c in holding) else PARKED
        else:
            owner[chunk_id], holders[chunk_id] = 0, 0  # reserved past the conversation's end
    lanes = tuple(
        LanePicture(
            index=lane.index,
            state=_lane_state(lane),
            conv_id=lane.conv.conv_id if lane.conv is not None else 0,
            num_cells=lane.conv.num_cells if lane.conv is not None else 0,
            num_chunks=layout.num_chunks_in_lane(lane.index, lane.conv.table if lane.conv else None),
            request_id=lane.seq.request_id if lane.seq is not None else None,
            num_prompt_tokens=len(lane.seq.prompt_ids) if lane.seq is not None else 0,
            num_output_tokens=lane.seq.num_output if lane.seq is not None else 0,
        )
        for lane in scheduler.lanes
    )
    parked = tuple(
        ParkedPicture(c.conv_id, c.num_cells, len(c.table.chunk_ids) if layout.holds_parked else 0, c.lane)
        for c in cache.idle_lru()
    )
    counters = scheduler.counters
    return PoolPicture(
        step=step,
        pooled=layout.name == "pooled",
        chunk_size=size,
        num_chunks=n,
        num_chunks_free=pool.num_free,
        chunk_owner=tuple(owner),
        chunk_holders=tuple(holders),
        chunk_filled=tuple(filled),
        chunk_state=tuple(state),
        lanes=lanes,
        parked=parked,
        num_queued=len(scheduler.waiting),
        num_running=len(scheduler.seqs),
        num_evictions=counters.num_evictions,
        num_refusals=counters.num_refusals,
        num_truncations=counters.num_truncations,
        max_context=max_context,
    )

"""The pool as a picture: who holds each chunk, what each lane does, who is parked.

Taken by the engine (`Engine.picture`) on the thread that steps it, from the scheduler (no
torch), then handed to the HTTP side as a frozen value, like `snapshot.EngineSnapshot`. Chunk ownership comes from
the pool's read-only `chunk_owners` over the conversations' tables.

With sliding-window layer groups (kv/groups.py, docs/windows.md) the fields above are the full
group's (group 0), and `groups` holds one `GroupPicture` per windowed group, each its own chunk
map over its own pool's ids: a windowed chunk is ACTIVE or PARKED while the window of a holder's
next token reads it, KEPT while it is held only for a kept window (the window before a
checkpoint or a prompt's end, where a branch goes on from). Without groups `groups` is empty.

Invariants of a picture (and of each `GroupPicture`):
- `len(chunk_owner) == len(chunk_holders) == len(chunk_filled) == len(chunk_state) == num_chunks`;
- `chunk_owner[i]` is the oldest conversation listing chunk i (0: none), `chunk_holders[i]`
  how many list it (> 1: shared by a common prefix);
- `chunk_filled[i]` cells of chunk i hold written K/V (0..chunk_size) for its fullest holder;
- `parked` lists the idle conversations least recently used first: the order they give way.
"""

from __future__ import annotations

from dataclasses import dataclass

from collections.abc import Sequence

from strata.engine.conversation import Conversation, Lane
from strata.engine.scheduler import Scheduler
from strata.kv.window_table import needed_from

# chunk_state values (RESERVED: a lane's empty reservation; SESSION: held only by a session file in
# flight; KEPT: a windowed group's chunk held only for a kept window)
FREE, ACTIVE, PARKED, RESERVED, SESSION, KEPT = 0, 1, 2, 3, 4, 5


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
    window_chunks: tuple[int, ...] = ()  # with layer groups: the chunks it holds in each windowed group


@dataclass(frozen=True)
class ParkedPicture:
    conv_id: int
    num_cells: int
    num_chunks: int
    lane: int | None  # idle in a lane, or None: parked in the pool without a lane
    window_chunks: tuple[int, ...] = ()  # with layer groups: the chunks it holds in each windowed group


@dataclass(frozen=True)
class GroupPicture:
    """One windowed layer group's chunk store: its own pool of ids, holding only its layers."""

    window: int  # the cells its layers read behind each token
    layers: tuple[int, ...]
    bytes_per_cell: int  # K and V of one position in its layers
    num_chunks: int
    num_chunks_free: int
    num_chunks_kept: int  # held only for kept windows (chunk_state KEPT)
    chunk_owner: tuple[int, ...]
    chunk_holders: tuple[int, ...]
    chunk_filled: tuple[int, ...]
    chunk_state: tuple[int, ...]


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
    # With layer groups: the full group's layers (none for a model whose every layer has a window)
    # and their bytes per cell, then each windowed group's map; without groups: (), 0, ().
    full_layers: tuple[int, ...] = ()
    full_bytes_per_cell: int = 0
    groups: tuple[GroupPicture, ...] = ()


def _filled(conv: Conversation, position: int, chunk_size: int) -> int:
    """Cells of the conversation's `position`-th chunk that hold written K/V."""
    return max(0, min(chunk_size, conv.num_cells - position * chunk_size))


def _lane_state(lane: Lane) -> str:
    if lane.seq is not None:
        return "prefill" if lane.seq.is_prefilling else "decode"
    return "empty" if lane.conv is None else "idle"


def _window_chunks(conv: Conversation | None, num_groups: int) -> tuple[int, ...]:
    """The chunks `conv` holds in each windowed group (zeros without a conversation)."""
    return tuple(len(conv.table.windows[g].held) if conv is not None else 0 for g in range(num_groups))


def take_picture(scheduler: Scheduler, max_context: int, step: int,
                 groups: Sequence[tuple[tuple[int, ...], int]] = ()) -> PoolPicture:
    """Call on the engine thread only (or wherever the scheduler is not changing). `groups`: each
    layer group's (layers, K/V bytes per cell), the full group first, when the K/V storage keeps
    windowed groups apart (empty: one group)."""
    layout, cache = scheduler.layout, scheduler.cache
    assert not layout.window_pools or len(groups) == 1 + len(layout.window_pools), "a windowed pool without its group"
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
            window_chunks=_window_chunks(lane.conv, len(layout.window_pools)),
        )
        for lane in scheduler.lanes
    )
    parked = tuple(
        ParkedPicture(c.conv_id, c.num_cells, len(c.table.chunk_ids) if layout.holds_parked else 0, c.lane,
                      _window_chunks(c, len(layout.window_pools)))
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
        full_layers=groups[0][0] if layout.window_pools else (),
        full_bytes_per_cell=groups[0][1] if layout.window_pools else 0,
        groups=tuple(_group_picture(scheduler, convs, g, *groups[g + 1]) for g in range(len(layout.window_pools))),
    )


def _group_picture(scheduler: Scheduler, convs: list[Conversation], g: int, layers: tuple[int, ...],
                   bytes_per_cell: int) -> GroupPicture:
    """Windowed group g + 1's map (`convs`: by conversation id, as the full group's owners)."""
    layout = scheduler.layout
    pool, window, size = layout.window_pools[g], layout.windows[g], layout.chunk_size
    n = pool.num_total
    owner, holders, filled, state = [0] * n, [0] * n, [0] * n, [FREE] * n
    for table in scheduler.holds.tables():
        for chunk_id in table.windows[g].held if table.windows else ():
            state[chunk_id] = SESSION
    read: dict[int, list[Conversation]] = {}  # chunk id -> the holders whose next token's window reads it
    for conv in convs:
        w = conv.table.windows[g]
        first = needed_from(conv.num_cells, window, size)
        for position, chunk_id in enumerate(w.chunk_ids):
            if chunk_id is not None:
                filled[chunk_id] = max(filled[chunk_id], _filled(conv, position, size))
                if position >= first:
                    read.setdefault(chunk_id, []).append(conv)
    owners = pool.chunk_owners((c, c.table.windows[g].held) for c in convs)
    for chunk_id, holding in owners.items():
        owner[chunk_id], holders[chunk_id] = holding[0].conv_id, len(holding)
        readers = read.get(chunk_id, ())
        state[chunk_id] = KEPT if not readers else ACTIVE if any(c.is_active for c in readers) else PARKED
    return GroupPicture(
        window=window,
        layers=tuple(layers),
        bytes_per_cell=bytes_per_cell,
        num_chunks=n,
        num_chunks_free=pool.num_free,
        num_chunks_kept=state.count(KEPT),
        chunk_owner=tuple(owner),
        chunk_holders=tuple(holders),
        chunk_filled=tuple(filled),
        chunk_state=tuple(state),
    )

"""Room in the windowed layer groups (kv/groups.py): grown per step, made by idle conversations.

A windowed group's table grows only for the cells a step writes (a prefill piece, a pending
token and its drafts), after the full group's room is decided and the step's work is
planned; its chunks behind the window go back at commit (kv/window_table.py). Each
windowed pool holds every lane's window and step (build.py sizes it so), so a running
lane never waits or ends for windowed room. When a windowed pool is short, in this order:
(1) kept windows give way (the windows before checkpoints and prompts' ends: a branch from
there recomputes): idle conversations' first, least recently used first, then running
ones', oldest first, one conversation's at a time until the need is covered; (2) idle
conversations give way, least recently used first, and only when the ones chosen together
cover every group's need. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from strata.engine.conversation import Conversation
from strata.engine.conversation import Sequence as Seq
from strata.kv import window_table as wt
from strata.step import LaneWork

if TYPE_CHECKING:
    from strata.engine.lanes import Lanes


def _short(lanes: Lanes, needs: Sequence[int], chosen: Iterable[Conversation]) -> bool:
    pools = lanes.layout.window_pools
    freed = lanes.layout.num_window_chunks_freed(c.table for c in chosen)
    return any(need > pool.num_free + f for need, pool, f in zip(needs, pools, freed))


def _drop_kept(lanes: Lanes, needs: Sequence[int], protect: Mapping[int, int]) -> None:
    """Step (1): kept windows give way, in the module's order, until `needs` are covered; a
    protected conversation (id -> position) keeps the window before its position only."""
    layout = lanes.layout
    idle = lanes.cache.idle_lru()
    active = sorted((c for c in lanes.cache if c.is_active), key=lambda c: c.last_used)
    for conv in idle + active:
        if not _short(lanes, needs, ()):
            return
        if not any(layout.num_window_chunks_kept([conv.table])):
            continue
        if conv.conv_id in protect:
            layout.keep_window_only(conv.table, protect[conv.conv_id])
        else:
            layout.drop_kept_windows(conv.table)


def make_window_room(lanes: Lanes, needs: Sequence[int], protect: Iterable[tuple[Conversation, int]] = ()) -> int:
    """Idle conversations (never `protect`'s: a conversation and the position an admission goes on
    from, whose window stays) give way, in the module's order, until every windowed pool has
    `needs[g]` free chunks. Returns how many conversations gave way."""
    protect = tuple(protect)
    if not _short(lanes, needs, ()):
        return 0
    protected = {c.conv_id: n for c, n in protect}
    _drop_kept(lanes, needs, protected)
    if not _short(lanes, needs, ()):
        return 0
    chosen: list[Conversation] = []
    for conv in lanes.cache.idle_lru(exclude=tuple(c for c, _ in protect)):
        chosen.append(conv)
        if not _short(lanes, needs, chosen):
            break
    else:
        raise AssertionError(f"windowed pools short of {list(needs)} with every idle conversation gone: "
                             "they are sized to hold every lane's window")
    for conv in list(chosen):  # spare the ones that add nothing to what the others free
        rest = [c for c in chosen if c is not conv]
        if not _short(lanes, needs, rest):
            chosen = rest
    lanes.evict(tuple(chosen))
    return len(chosen)


def grow_step_windows(work: Sequence[LaneWork], seqs: Mapping[str, Seq], lanes: Lanes) -> tuple[LaneWork, ...]:
    """Room in every windowed group for each lane's cells this step; the work, each lane given
    its windowed groups' chunk ids."""
    layout = lanes.layout
    if not layout.window_pools:
        return tuple(work)
    needs = [0] * len(layout.window_pools)
    for w in work:  # a draft model's drafts (--spec draft) are written this step too
        for g, n in enumerate(layout.num_window_chunks_to_grow(seqs[w.request_id].conv.table,
                                                               w.num_cells + w.draft_slots)):
            needs[g] += n
    make_window_room(lanes, needs)
    out = []
    for w in work:
        table = seqs[w.request_id].conv.table
        layout.grow_windows(table, w.num_cells + w.draft_slots)
        out.append(replace(w, window_ids=tuple(tuple(x.chunk_ids) for x in table.windows)))
    return tuple(out)


def plan_restore_windows(lanes: Lanes, num_cells: int, kept: Sequence[int], victims: Sequence[Conversation]
                         ) -> tuple[tuple[int, ...], tuple[Conversation, ...], bool] | None:
    """A restore's room in the windowed groups, planned (nothing changes): (the kept positions
    whose windows it holds, the idle conversations that give way besides `victims`, whether
    other conversations' kept windows give way), or None when there is no room. The module's
    order, with the restore's own kept windows giving way (the oldest first) after the others'
    and before any conversation; its last window always stays. `make_window_room` at the take
    then does exactly this: after `victims` go, dropping kept windows covers the need."""
    layout = lanes.layout
    if not layout.window_pools:
        return tuple(kept), (), False
    c, pools = layout.chunk_size, layout.window_pools

    def room(gone: Sequence[Conversation], drops: bool) -> list[int]:
        """Free chunks per group once `gone` gave way (and, `drops`, every other kept window)."""
        skip = {v.conv_id for v in gone}
        others = [t.table for t in lanes.cache if t.conv_id not in skip] if drops else []
        return [pool.num_free + pool.num_freed_by_release(
                    [i for v in gone for i in v.table.windows[g].held]
                    + [i for t in others for i in wt.kept_only(t.windows[g], t.num_cells)])
                for g, pool in enumerate(pools)]

    def needs(k: Sequence[int]) -> list[int]:
        return [wt.num_to_hold(w, c, num_cells, list(k)) for w in layout.windows]

    def fits(k: Sequence[int], gone: Sequence[Conversation], drops: bool) -> bool:
        return all(n <= r for n, r in zip(needs(k), room(gone, drops)))

    kept = list(kept)
    while True:
        if fits(kept, victims, False):
            return tuple(kept), (), False
        if fits(kept, victims, True):
            return tuple(kept), (), True
        if not kept:
            break
        kept = kept[1:]
    more: list[Conversation] = []
    for conv in lanes.cache.idle_lru(exclude=victims):
        more.append(conv)
        if fits((), [*victims, *more], True):
            return (), tuple(more), True
    return None

"""Admission planning: which lane a new request takes, what K/V it reuses, who gives way.

Pure planning over the scheduler's state (nothing is changed here), so a request
that is refused leaves no trace.

Rules (DESIGN.md, "Behaviour users rely on"):
- a follow-up that extends an idle conversation takes it over whole, in its own lane
  when it sits in one;
- a branch (a prompt sharing only part of a conversation) forks the shared prefix and
  leaves the original cached;
- a new conversation takes an empty lane before it displaces anyone's idle one; among
  idle lanes, the least recently used;
- when the pool lacks room, idle conversations give way least recently used first, and
  only when the ones chosen together cover the need.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from strata.engine.conversation import Conversation, Lane
from strata.kv.table import chunks_for

if TYPE_CHECKING:
    from strata.engine.lanes import Lanes


class Reuse(Enum):
    NONE = "none"  # a new conversation
    EXTEND = "extend"  # take the cached conversation over (truncated to the shared prefix)
    FORK = "fork"  # a new conversation starting with a copy/share of the shared prefix


@dataclass(frozen=True)
class AdmissionPlan:
    lane: int
    reuse: Reuse
    source: Conversation | None
    num_cached: int
    num_chunks_needed: int
    victims: tuple[Conversation, ...]  # idle conversations evicted to make room


@dataclass(frozen=True)
class NoRoom:
    num_chunks_needed: int
    num_chunks_free: int  # free now plus what every idle conversation could give


@dataclass(frozen=True)
class RestorePlan:
    """Where a restored conversation goes (session files, synthetic K/V) and who gives way."""

    num_cells: int
    lane: int | None  # None: parked without a lane (pooled only)
    victims: tuple[Conversation, ...]  # idle conversations evicted to make room
    displaced: Conversation | None  # the idle conversation in `lane` now
    holds_parked: bool  # the layout parks a displaced conversation (else it is evicted)
    kept: tuple[int, ...] = ()  # positions whose windows the restore keeps in every windowed group
    drops_kept_windows: bool = False  # other conversations' kept windows give way for its windowed room

    @property
    def loses_conversations(self) -> bool:
        """Taking the room evicts someone for good (a displaced one is parked where it can be), or
        makes kept windows give way (a branch from them would recompute)."""
        return (bool(self.victims) or (self.displaced is not None and not self.holds_parked)
                or self.drops_kept_windows)


@dataclass(frozen=True)
class Blocked:
    """The request waits for a session file in flight: it extends a conversation in a lane a
    session file holds (`lane`), or one being restored (`lane` None)."""

    lane: int | None


def pick_lane(lanes: Iterable[Lane]) -> Lane | None:
    """An empty lane (lowest index) first, else the idle lane used least recently; never a lane
    a session file in flight holds (its `pinned_by`)."""
    lanes = [lane for lane in lanes if not lane.is_pinned]
    for lane in lanes:
        if lane.is_empty:
            return lane
    idle = [lane for lane in lanes if lane.is_idle]
    return min(idle, key=lambda lane: lane.conv.last_used) if idle else None


def choose_victims(lanes: Lanes, num_chunks: int, protect: tuple[Conversation, ...] = ()
                   ) -> tuple[Conversation, ...] | None:
    """The least recently used idle conversations that together free `num_chunks`, or None."""
    cache, layout = lanes.cache, lanes.layout
    if num_chunks <= 0:
        return ()
    chosen: list[Conversation] = []
    for conv in cache.idle_lru(exclude=protect):
        chosen.append(conv)
        if layout.num_freed_by_release(c.table for c in chosen) >= num_chunks:
            break
    else:
        return None
    # Spare the ones that add nothing to what the others free (a conversation whose chunks
    # are all shared with a running one): evicting them would help no one.
    freed = layout.num_freed_by_release(c.table for c in chosen)
    for conv in list(chosen):
        rest = [c for c in chosen if c is not conv]
        if layout.num_freed_by_release(c.table for c in rest) == freed:
            chosen = rest
    return tuple(chosen)


def plan_admission(prompt_ids: list[int], lanes: Lanes) -> AdmissionPlan | NoRoom | Blocked | None:
    """None when no lane is free (the request waits); Blocked when it would extend a conversation
    in a lane a session file holds (it waits for that one).

    The room asked for covers the prompt and the first token it will decode, so an
    admitted request is never ended by the pool before it has produced anything.
    """
    num_prompt = len(prompt_ids)
    source, num_shared = lanes.cache.longest_prefix(prompt_ids)
    num_shared = min(num_shared, num_prompt - 1)  # at least one token is fed to get logits
    if source is not None:  # windowed groups go on only where they hold the window (kv/groups.py)
        num_shared = lanes.layout.reusable(source.table, num_shared)
    if source is None or num_shared == 0:
        return _plan(Reuse.NONE, None, 0, num_prompt, lanes)
    reuse = Reuse.EXTEND if not source.is_active and num_shared == source.num_cells else Reuse.FORK
    plan = _plan(reuse, source, num_shared, num_prompt, lanes)
    if not isinstance(plan, NoRoom) or source.is_active or reuse is Reuse.EXTEND:
        return plan  # (extending all of it, a fresh start would need just what it frees)
    # The idle conversation this request branches from holds the room itself: rather than
    # refuse every branch of it, it gives way: its tail first (a branch in place keeps the
    # shared prefix), then all of it (when keeping the prefix costs a copy of its last chunk).
    in_place = _plan(Reuse.EXTEND, source, num_shared, num_prompt, lanes)
    if not isinstance(in_place, NoRoom):
        return in_place
    return _plan(Reuse.NONE, None, 0, num_prompt, lanes)  # a refusal: the whole pool is too small


def _plan(
    reuse: Reuse,
    source: Conversation | None,
    num_shared: int,
    num_prompt: int,
    lanes: Lanes,
) -> AdmissionPlan | NoRoom | Blocked | None:
    cache, layout = lanes.cache, lanes.layout
    if reuse is Reuse.EXTEND and source.lane is not None:
        lane = lanes[source.lane]
        if lane.is_pinned:
            return Blocked(lane.index)
    else:
        lane = pick_lane(lanes)
        if lane is None:
            return None
        if reuse is Reuse.FORK and lane.conv is source and not layout.holds_parked:
            reuse = Reuse.EXTEND  # a lane's reservation cannot fork into itself: branch in place

    held = need = freed = 0
    if reuse is Reuse.EXTEND:
        held = len(source.table.chunk_ids)
        # A branch in place: the tail gives way first. Extending all of it may copy too: its
        # partial last chunk is shared while a session file in flight holds it (copy-on-write).
        need = layout.num_chunks_to_truncate(source.table, num_shared)
        if num_shared < source.num_cells:
            freed = layout.num_freed_by_truncate(source.table, num_shared)
            held = chunks_for(num_shared, layout.chunk_size)
    elif reuse is Reuse.FORK:
        held = chunks_for(num_shared, layout.chunk_size)
        need = layout.num_chunks_to_fork(num_shared)
    need += layout.num_chunks_to_grow_from(held, num_prompt + 1)

    protect = (source,) if source is not None else ()
    victims = choose_victims(lanes, need - layout.pool.num_free - freed, protect)
    if victims is None:
        everyone = layout.num_freed_by_release(v.table for v in cache.idle_lru(exclude=protect))
        return NoRoom(need, layout.pool.num_free + freed + everyone)
    return AdmissionPlan(
        lane=lane.index,
        reuse=reuse,
        source=source,
        num_cached=num_shared if reuse is not Reuse.NONE else 0,
        num_chunks_needed=need,
        victims=victims,
    )

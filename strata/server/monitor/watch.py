"""Pictures of the pool while someone watches, and the pool's events between them.

The engine thread calls `observe` after every step (and after queued commands); it takes a
picture only while at least one monitor feed is open, so an unwatched server pays one
integer read per step. Events are found by comparing consecutive pictures: counters that
rose (evictions, refusals, truncations) and the conversations that vanished with them.

Invariants:
- `picture` and `events` are replaced by one reference assignment each (the HTTP side reads
  them from another thread); `events` is a tuple, the last `MAX_EVENTS`, `seq` ascending;
- `watchers` is changed by the asyncio thread only, read by the engine thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from strata.engine.interface import PoolPicture

MAX_EVENTS = 200


@dataclass(frozen=True)
class PoolEvent:
    seq: int  # ascending across the server's life
    kind: str  # "eviction" | "refusal" | "truncation"
    count: int
    conv_ids: tuple[int, ...]  # the conversations it ended, where the pictures tell
    at: float  # wall-clock seconds (time.time())
    step: int  # the picture it was seen in


class PoolWatch:
    def __init__(self) -> None:
        self.watchers = 0
        self.picture: PoolPicture | None = None
        self.events: tuple[PoolEvent, ...] = ()
        self._num_pictures = 0
        self._num_events = 0

    def observe(self, take_picture: Callable[[int], PoolPicture]) -> None:
        """Engine thread only; `take_picture(n)`: the engine's picture number n (`Engine.picture`)."""
        if self.watchers <= 0:
            self.picture = None  # the next watcher starts from a fresh picture, not a stale diff
            return
        self._num_pictures += 1
        picture = take_picture(self._num_pictures)
        if self.picture is not None:
            found = diff_events(self.picture, picture)
            if found:
                now, events = time.time(), []
                for kind, count, conv_ids in found:
                    self._num_events += 1
                    events.append(PoolEvent(self._num_events, kind, count, conv_ids, now, picture.step))
                self.events = (*self.events, *events)[-MAX_EVENTS:]
        self.picture = picture


def diff_events(before: PoolPicture, after: PoolPicture) -> list[tuple[str, int, tuple[int, ...]]]:
    """(kind, count, conversations) for each counter that rose between two pictures.

    An idle conversation leaves only by eviction, so the idle ones that vanished are the
    evicted ones. A running one leaves by truncation, abort or failure: the vanished running
    ones are named only when their number equals the truncations counted.
    """
    now_held = {lane.conv_id for lane in after.lanes} | {p.conv_id for p in after.parked}
    vanished_idle = tuple(p.conv_id for p in before.parked if p.conv_id not in now_held)
    vanished_running = tuple(
        lane.conv_id
        for lane in before.lanes
        if lane.state in ("prefill", "decode") and lane.conv_id not in now_held
    )
    found = []
    evictions = after.num_evictions - before.num_evictions
    if evictions > 0:
        found.append(("eviction", evictions, vanished_idle))
    refusals = after.num_refusals - before.num_refusals
    if refusals > 0:
        found.append(("refusal", refusals, ()))
    truncations = after.num_truncations - before.num_truncations
    if truncations > 0:
        named = vanished_running if len(vanished_running) == truncations else ()
        found.append(("truncation", truncations, named))
    return found

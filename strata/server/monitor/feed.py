"""The monitor's live feed: server-sent events, `FRAMES_PER_S` frames a second.

Each frame is one JSON object:
- `picture`: the pool (`picture.PoolPicture`, with one chunk map per windowed layer group in
  `groups` for a sliding-window model in a pool), only when it changed since the last frame;
- `events`: pool events (`watch.PoolEvent`) not sent before, oldest first;
- `samples`: machine and server samples (`history.Sample`) not sent before (the first
  frame carries the whole history);
- `moe`: the expert cache's counters and the device budget's split (CachedBank.stats), when
  the engine has an expert cache and they changed since the last frame;
- `model`, `state`: the model id and the engine loop's state.
While a feed is open the engine thread takes a picture every step (`PoolWatch.watchers`).
The feed ends when the engine loop stops, or as soon as `stopping()` says the server is
shutting down (uvicorn waits for open responses before it stops the app: a feed that never
ends would hold the shutdown for its whole grace period).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

from strata.server.engine_loop import EngineLoop
from strata.server.monitor.history import History
from strata.server.sse import data_event

FRAMES_PER_S = 4


async def frames(
    loop: EngineLoop, history: History, model_id: str, stopping: Callable[[], bool]
) -> AsyncIterator[str]:
    watch = loop.pool_watch
    last_step, last_event, last_sample = -1, 0, 0.0
    last_moe = None
    if watch.events:
        last_event = watch.events[-1].seq  # a new feed starts with the events to come
    while loop.state in ("loading", "ready") and not stopping():
        frame: dict[str, Any] = {"model": model_id, "state": loop.state}
        picture = watch.picture
        if picture is not None and picture.step != last_step:
            frame["picture"] = dataclasses.asdict(picture)
            last_step = picture.step
        snap = loop.snapshot
        moe = snap.moe if snap is not None else None
        if moe is not None and moe != last_moe:
            frame["moe"] = moe
            last_moe = moe
        events = [dataclasses.asdict(e) for e in watch.events if e.seq > last_event]
        if events:
            frame["events"] = events
            last_event = events[-1]["seq"]
        samples = [dataclasses.asdict(s) for s in list(history.samples) if s.at > last_sample]
        if samples:
            frame["samples"] = samples
            last_sample = samples[-1]["at"]
        yield data_event(frame)
        await asyncio.sleep(1 / FRAMES_PER_S)

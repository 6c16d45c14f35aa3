"""What the asyncio side asks of the engine thread, through `EngineLoop`'s inbox."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass

from strata.engine.interface import Engine, Prompt
from strata.sampling import SamplingParams


@dataclass(frozen=True)
class Add:
    """n choices of one prompt (one request id and params each; n is usually 1)."""

    request_ids: tuple[str, ...]
    prompt: Prompt | list[int]  # a Prompt was checked at the edge
    params: tuple[SamplingParams, ...]
    arrival: float


@dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclass(frozen=True)
class Call:
    """Run `fn(engine)` on the engine thread between steps; its result or error goes to `future`."""

    fn: Callable[[Engine], object]
    future: concurrent.futures.Future


STOP = object()
WAKE = object()  # no work: the engine thread wakes and observes (a monitor opened)

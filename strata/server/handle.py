"""What an HTTP handler holds while its request runs: a handle, and the events it receives.

Events arrive in order: `Admitted` once the request holds a lane, then `RequestOutput`s;
the last is final (`is_final`): a finished output (stop, length, abort, or a refusal
carrying `error`) or `Failed`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from strata.engine.interface import RequestOutput


@dataclass(frozen=True)
class Admitted:
    num_cached_tokens: int


@dataclass(frozen=True)
class Failed:
    error: BaseException  # a RequestError from Engine.submit, or the engine itself failed


Event = Admitted | RequestOutput | Failed


def is_final(event: Event) -> bool:
    return isinstance(event, Failed) or (isinstance(event, RequestOutput) and event.finished)


class _Owner(Protocol):
    def close(self, handle: RequestHandle) -> None: ...


class RequestHandle:
    """One request as its HTTP handler sees it (asyncio thread only)."""

    def __init__(self, request_id: str, owner: _Owner):
        self.request_id = request_id
        self._owner = owner
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self.admitted = False
        self.done = False  # the final event was delivered, or the handle was closed

    def put(self, event: Event) -> None:
        if not isinstance(event, Failed):
            self.admitted = True
        self._events.put_nowait(event)

    async def next(self, timeout: float | None = None) -> Event | None:
        """The next event; None when `timeout` seconds pass without one (0: do not wait)."""
        if not self._events.empty():
            return self._events.get_nowait()
        if timeout == 0:
            return None
        try:
            return await asyncio.wait_for(self._events.get(), timeout)
        except asyncio.TimeoutError:
            return None

    def close(self) -> None:
        """The handler is done with the request; a request still running is cancelled."""
        self._owner.close(self)

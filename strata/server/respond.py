"""One generation over HTTP, for every API (OpenAI chat and completions, Anthropic Messages):
submit, wait for admission, then answer whole or as a stream, in the shape a
`ResponseFormat` gives.

Before any byte is sent, every failure is an ordinary HTTP error: a refusal at admission
is a 503 `kv_pool_full` with `Retry-After` (Anthropic's routes: 529), a bad request a 400.
A streaming request starts its stream when it is admitted, or when it has waited
`sse_keepalive_s` for a lane; after that, a refusal or a failure is the format's error
event, and the stream ends. While nothing happens the stream sends the format's keepalive.

A client that goes away is noticed while the request waits, runs, or streams; the handle
is closed, which cancels the request at the engine's next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from strata.engine.interface import Collected, RequestOutput
from strata.server.engine_loop import EngineLoop
from strata.server.handle import Admitted, Event, Failed, RequestHandle
from strata.server.params import Job
from strata.server.sse import EventStream

T = TypeVar("T")
CLIENT_CLOSED = 499  # nginx's code; nobody reads it, the client is gone


class ResponseFormat(Protocol):
    """How one API spells a response: the stream's events (whole SSE strings) and the body."""

    def opening(self, first: Event | None) -> list[str]:
        """Events before any text (`first`: the event the stream starts on; None: none yet)."""

    def delta(self, out: RequestOutput) -> list[str]:
        """Events for one output's new text (and logprobs)."""

    def closing(self, final: RequestOutput) -> list[str]:
        """Events after the last output (finish reason, usage, the end marker)."""

    def error(self, error: BaseException) -> list[str]:
        """Events for a failure after the stream started (the stream ends after them)."""

    def keepalive(self, admitted: bool) -> str:
        """What a stream sends while nothing happens."""

    def whole(self, got: Collected) -> dict:
        """The body of a non-streamed response."""


class Disconnected(Exception):
    pass


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`await work`, or raise Disconnected as soon as the client goes away."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    raise Disconnected


def _failure(event: Event | None) -> BaseException | None:
    if isinstance(event, Failed):
        return event.error
    if isinstance(event, RequestOutput):
        return event.error
    return None


async def _collect(handle: RequestHandle) -> Collected:
    """Every output of the request; raises its error (refused, failed)."""
    got = Collected()
    while True:
        event = await handle.next()
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, RequestOutput) and got.add(event):
            return got


async def first_event(request: Request, handle: RequestHandle, keepalive_s: float) -> Event | None:
    """A stream's first event; raises the request's error when it ended before any token."""
    first = await unless_disconnected(request, handle.next(timeout=keepalive_s))
    if (error := _failure(first)) is not None:
        raise error
    return first


async def respond(request: Request, loop: EngineLoop, job: Job, fmt_for, keepalive_s: float) -> Response:
    """Run `job`; `fmt_for(request_id)` builds the request's ResponseFormat."""
    handle = loop.submit(job.prompt, job.params)
    fmt: ResponseFormat = fmt_for(handle.request_id)
    try:
        if job.stream:
            first = await first_event(request, handle, keepalive_s)
            stream = EventStream(_events(handle, first, fmt, keepalive_s), on_close=handle.close)
            handle = None  # the stream owns it now
            return stream
        got = await unless_disconnected(request, _collect(handle))
        return JSONResponse(fmt.whole(got))
    except Disconnected:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        if handle is not None:
            handle.close()


async def _events(handle: RequestHandle, first: Event | None, fmt: ResponseFormat,
                  keepalive_s: float) -> AsyncIterator[str]:
    for opening in fmt.opening(first):
        yield opening
    event = first
    while True:
        if event is None:
            yield fmt.keepalive(handle.admitted)
        elif (error := _failure(event)) is not None:  # refused or failed after the stream started
            for e in fmt.error(error):
                yield e
            return
        elif isinstance(event, RequestOutput):
            for delta in fmt.delta(event):
                yield delta
            if event.finished:
                for closing in fmt.closing(event):
                    yield closing
                return
        elif not isinstance(event, Admitted):
            raise AssertionError(f"unexpected event {event!r}")
        event = await handle.next(timeout=keepalive_s if keepalive_s > 0 else None)

"""One generation over HTTP: submit, wait for admission, then answer whole or as a stream.

Before any byte is sent, every failure is an ordinary HTTP error: a refusal at admission
is a 503 `kv_pool_full` with `Retry-After`, a bad request a 400. A streaming request
starts its stream when it is admitted, or when it has waited `sse_keepalive_s` for a lane;
after that, a refusal or a failure is an SSE error event (with `retry_after` when
retryable) followed by `[DONE]`.

A client that goes away is noticed while the request waits, runs, or streams; the handle
is closed, which cancels the request at the engine's next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from strata.engine.request import RequestOutput
from strata.sampler import TokenLogprobs
from strata.server.engine_loop import EngineLoop
from strata.server.errors import error_body
from strata.server.formats import Format
from strata.server.handle import Admitted, Event, Failed, RequestHandle
from strata.server.params import Job
from strata.server.sse import DONE, EventStream, comment, data_event

T = TypeVar("T")
CLIENT_CLOSED = 499  # nginx's code; nobody reads it, the client is gone


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


@dataclass
class Collected:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    final: RequestOutput | None = None
    failure: BaseException | None = None


async def _collect(handle: RequestHandle, first: Event | None) -> Collected:
    got = Collected()
    event = first
    while True:
        if isinstance(event, Failed):
            got.failure = event.error
            return got
        if isinstance(event, RequestOutput):
            if event.error is not None:
                got.failure = event.error
                return got
            got.text.append(event.new_text)
            got.logprobs.extend(event.new_logprobs)
            if event.finished:
                got.final = event
                return got
        event = await handle.next()


async def first_event(request: Request, handle: RequestHandle, keepalive_s: float) -> Event:
    """A stream's first event; raises the request's error when it ended before any token."""
    first = await unless_disconnected(request, handle.next(timeout=keepalive_s))
    if isinstance(first, Failed):
        raise first.error
    if isinstance(first, RequestOutput) and first.error is not None:
        raise first.error
    return first


async def respond(
    request: Request,
    loop: EngineLoop,
    job: Job,
    fmt_for: Callable[[str], Format],
    keepalive_s: float,
) -> Response:
    """Run `job`; `fmt_for(request_id)` builds the endpoint's Format."""
    handle = loop.submit(job.prompt_ids, job.params)
    fmt: Format = fmt_for(handle.request_id)
    try:
        if job.stream:
            first = await first_event(request, handle, keepalive_s)
            stream = EventStream(
                _events(handle, first, fmt, job, keepalive_s), on_close=handle.close
            )
            handle = None  # the stream owns it now
            return stream
        got = await unless_disconnected(request, _collect(handle, None))
        if got.failure is not None:
            raise got.failure
        assert got.final is not None
        body = fmt.response("".join(got.text), got.logprobs, got.final)
        return JSONResponse(body.model_dump(mode="json", exclude_none=False))
    except Disconnected:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        if handle is not None:
            handle.close()


async def _events(
    handle: RequestHandle, first: Event | None, fmt: Format, job: Job, keepalive_s: float
) -> AsyncIterator[str]:
    for opening in fmt.opening():
        yield data_event(opening)
    event = first
    while True:
        if event is None:
            yield comment("waiting" if not handle.admitted else "working")
        elif isinstance(event, Failed):
            yield data_event({"error": error_body(event.error)})
            yield DONE
            return
        elif isinstance(event, RequestOutput):
            if event.error is not None:  # refused after the stream started
                yield data_event({"error": error_body(event.error)})
                yield DONE
                return
            delta = fmt.delta(event.new_text, event.new_logprobs)
            if delta is not None:
                yield data_event(delta)
            if event.finished:
                yield data_event(fmt.final(event))
                if job.include_usage:
                    yield data_event(fmt.usage(event))
                yield DONE
                return
        elif not isinstance(event, Admitted):
            raise AssertionError(f"unexpected event {event!r}")
        event = await handle.next(timeout=keepalive_s if keepalive_s > 0 else None)

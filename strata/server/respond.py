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
from collections.abc import AsyncIterator, Awaitable, Sequence
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
    """How one API spells a response: the stream's events (whole SSE strings) and the body.
    `index` is the choice (n > 1 choices of one prompt; 0 otherwise)."""

    def opening(self, first: Event | None) -> list[str]:
        """Events before any text (`first`: the event the stream starts on; None: none yet)."""

    def delta(self, out: RequestOutput, index: int = 0) -> list[str]:
        """Events for one output's new text (and logprobs)."""

    def closing(self, final: RequestOutput, index: int = 0) -> list[str]:
        """Events after a choice's last output (its finish reason)."""

    def done(self, finals: Sequence[RequestOutput]) -> list[str]:
        """Events after every choice ended (usage, the end marker)."""

    def error(self, error: BaseException) -> list[str]:
        """Events for a failure after the stream started (the stream ends after them)."""

    def keepalive(self, admitted: bool) -> str:
        """What a stream sends while nothing happens."""

    def whole(self, gots: Sequence[Collected]) -> dict:
        """The body of a non-streamed response (one Collected per choice)."""


class Disconnected(Exception):
    pass


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _retrieve(task: asyncio.Future) -> None:
    """Reads a cancelled task's outcome, so asyncio does not log it as never retrieved (a
    cancelled gather ends with CancelledError set as its exception, not as cancelled)."""
    if not task.cancelled():
        task.exception()


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
            task.add_done_callback(_retrieve)
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


class Choices:
    """The handles of one request's choices, read as one stream of (index, event)."""

    def __init__(self, handles: list[RequestHandle]):
        self.handles = handles
        self._waiting: dict[int, asyncio.Future] = {}

    @property
    def admitted(self) -> bool:
        return self.handles[0].admitted

    async def next(self, timeout: float | None, open_: set[int]) -> tuple[int, Event] | None:
        """The next event of a choice in `open_`, lowest index first; None after `timeout`."""
        for i in sorted(open_):
            if i not in self._waiting:
                self._waiting[i] = asyncio.ensure_future(self.handles[i].next())
        pending = {self._waiting[i] for i in open_}
        done, _ = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for i in sorted(open_):
            task = self._waiting[i]
            if task in done:
                del self._waiting[i]
                return i, task.result()
        return None

    def close(self) -> None:
        for task in self._waiting.values():
            task.cancel()
        for handle in self.handles:
            handle.close()


async def respond(request: Request, loop: EngineLoop, job: Job, fmt_for, keepalive_s: float) -> Response:
    """Run `job` (its n choices); `fmt_for(request_id)` builds the request's ResponseFormat."""
    handles = loop.submit_choices(job.prompt, job.choice_params())
    choices: Choices | None = Choices(handles)
    fmt: ResponseFormat = fmt_for(handles[0].request_id)
    try:
        if job.stream:
            first = await first_event(request, handles[0], keepalive_s)
            stream = EventStream(_events(choices, first, fmt, keepalive_s), on_close=choices.close)
            choices = None  # the stream owns them now
            return stream
        gots = await unless_disconnected(request, asyncio.gather(*(_collect(h) for h in handles)))
        return JSONResponse(fmt.whole(gots))
    except Disconnected:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        if choices is not None:
            choices.close()


async def _events(choices: Choices, first: Event | None, fmt: ResponseFormat,
                  keepalive_s: float) -> AsyncIterator[str]:
    for opening in fmt.opening(first):
        yield opening
    open_ = set(range(len(choices.handles)))
    finals: dict[int, RequestOutput] = {}
    item: tuple[int, Event] | None = (0, first) if first is not None else None
    while True:
        if item is None:
            yield fmt.keepalive(choices.admitted)
        else:
            index, event = item
            if (error := _failure(event)) is not None:  # refused or failed after the stream started
                for e in fmt.error(error):
                    yield e
                return
            if isinstance(event, RequestOutput):
                for delta in fmt.delta(event, index):
                    yield delta
                if event.finished:
                    for closing in fmt.closing(event, index):
                        yield closing
                    finals[index] = event
                    open_.discard(index)
                    if not open_:
                        for e in fmt.done([finals[i] for i in sorted(finals)]):
                            yield e
                        return
            elif not isinstance(event, Admitted):
                raise AssertionError(f"unexpected event {event!r}")
        item = await choices.next(keepalive_s if keepalive_s > 0 else None, open_)

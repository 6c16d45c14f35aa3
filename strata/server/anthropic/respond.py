"""One Messages generation over HTTP: submit, wait, then answer whole or as Anthropic's stream.

As on the OpenAI routes (`server/generate.py`): before any byte is sent every failure is an
ordinary error answer (a full pool: 529 `overloaded_error` with Retry-After, through
`AnthropicErrors`); a stream starts once the request is admitted, or after waiting
`keepalive_s` for a lane; after that a refusal or failure is an `error` event, and the
stream ends. While nothing happens the stream sends `ping` events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from strata.engine.request import RequestOutput
from strata.server.anthropic.errors import error_event_payload
from strata.server.anthropic.shapes import PING, MessageFormat, event
from strata.server.engine_loop import EngineLoop
from strata.server.generate import CLIENT_CLOSED, Disconnected, first_event, unless_disconnected
from strata.server.handle import Admitted, Event, Failed, RequestHandle
from strata.server.params import Job
from strata.server.sse import EventStream


async def _whole(handle: RequestHandle) -> tuple[str, RequestOutput]:
    text: list[str] = []
    while True:
        got = await handle.next()
        if isinstance(got, Failed):
            raise got.error
        if isinstance(got, RequestOutput):
            if got.error is not None:
                raise got.error
            text.append(got.new_text)
            if got.finished:
                return "".join(text), got


async def respond_messages(
    request: Request, loop: EngineLoop, job: Job, model: str, keepalive_s: float
) -> Response:
    handle: RequestHandle | None = loop.submit(job.prompt_ids, job.params)
    assert job.params.max_tokens is not None  # required by the Messages API
    fmt = MessageFormat(handle.request_id, model, job.params.max_tokens, len(job.prompt_ids))
    try:
        if job.stream:
            first = await first_event(request, handle, keepalive_s)
            stream = EventStream(_events(handle, first, fmt, keepalive_s), on_close=handle.close)
            handle = None  # the stream owns it now
            return stream
        text, final = await unless_disconnected(request, _whole(handle))
        return JSONResponse(fmt.message(text, final).model_dump(mode="json"))
    except Disconnected:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        if handle is not None:
            handle.close()


def _cached(first: Event | None) -> int:
    if isinstance(first, (Admitted, RequestOutput)):
        return first.num_cached_tokens
    return 0  # not admitted yet: message_delta's usage says how many were reused


async def _events(
    handle: RequestHandle, first: Event | None, fmt: MessageFormat, keepalive_s: float
) -> AsyncIterator[str]:
    for opening in fmt.opening(_cached(first)):
        yield opening
    event_ = first
    while True:
        if event_ is None:
            yield PING
        elif isinstance(event_, Failed) or (
            isinstance(event_, RequestOutput) and event_.error is not None
        ):
            error = event_.error
            assert error is not None
            yield event("error", error_event_payload(error))
            return
        elif isinstance(event_, RequestOutput):
            delta = fmt.delta(event_.new_text)
            if delta is not None:
                yield delta
            if event_.finished:
                for closing in fmt.closing(event_):
                    yield closing
                return
        elif not isinstance(event_, Admitted):
            raise AssertionError(f"unexpected event {event_!r}")
        event_ = await handle.next(timeout=keepalive_s if keepalive_s > 0 else None)

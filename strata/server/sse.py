"""Server-sent events: the wire format, and a response that notices a client leaving.

`EventStream` sends each string of its iterator as it comes, and watches the connection at
the same time: when the client disconnects (or a send fails) the iterator is closed and
`on_close` runs at once, whatever the ASGI server's spec version, so the request is
cancelled at the engine's next step instead of whenever the generator is collected.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def data_event(payload: str | dict[str, Any]) -> str:
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {text}\n\n"


def comment(text: str) -> str:
    """A comment line: clients ignore it; proxies see traffic."""
    return f": {text}\n\n"


class EventStream(Response):
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]):
        # No body attribute: Starlette then sets no Content-Length (the length is unknown).
        self.status_code = 200
        self.background = None
        self.init_headers(SSE_HEADERS)
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    group.cancel_scope.cancel()  # the client left: stop streaming

                group.start_soon(watch)
                try:
                    await send(
                        {
                            "type": "http.response.start",
                            "status": self.status_code,
                            "headers": self.raw_headers,
                        }
                    )
                    async for event in self._events:
                        await send(
                            {
                                "type": "http.response.body",
                                "body": event.encode("utf-8"),
                                "more_body": True,
                            }
                        )
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                except OSError:
                    pass  # the connection is gone (the watcher may not have seen it yet)
                finally:
                    group.cancel_scope.cancel()
        finally:
            self._on_close()
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()

"""One HTTP request carried from the front door to a replica, and its answer carried back.

The front door does not interpret the API: it hands the request (method, path, headers,
body) to the replica chosen by the router, which runs it through its own `strata serve`
app in process, so routes, validation, errors and streaming are exactly a single
server's. The answer comes back as a stream: first `ResponseStart`, then body pieces.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message


@dataclass
class ForwardedRequest:
    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    # Routing: the prompt's prefix keys (keys.py; empty when the request has no prompt or
    # could not be read: the replica's app then answers it, errors included).
    prompt_ids: list[int] = field(default_factory=list)
    prefix_keys: list[int] = field(default_factory=list)
    num_new_cells: int = 0  # prompt + max_tokens: what admitting it takes
    prompt: str | None = None  # the prompt's text, for Ray's PrefixCacheAffinityRouter only (ray_prefix.py)
    pin: str | None = None  # a replica id: only that replica may serve it (x-strata-replica)
    # Set by the router: the replica holding the longest prefix, and its matched tokens.
    holder: str | None = None
    holder_tokens: int = 0
    route: str = "any"  # why the router chose as it did: pin | prefix | free_cells | pow2 | any
    report_seq: int | None = None  # set by the router: the number of the chosen replica's report it routed by


@dataclass(frozen=True)
class ResponseStart:
    status: int
    headers: list[tuple[bytes, bytes]]
    replica: str
    migrated_tokens: int = 0  # prompt tokens whose K/V came from another replica


async def run_asgi(app: ASGIApp, req: ForwardedRequest, client: tuple[str, int]) -> AsyncIterator[Message]:
    """The ASGI messages `app` sends for `req` (http.response.start, then .body pieces).
    Closing the iterator early is a client disconnect: the app sees http.disconnect."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": req.method,
        "scheme": "http", "path": req.path, "raw_path": req.path.encode(), "query_string": req.query,
        "root_path": "", "headers": req.headers, "client": client, "server": ("strata-replica", 0),
    }
    out: asyncio.Queue = asyncio.Queue()
    body_sent = False
    disconnected = asyncio.Event()

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await out.put(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            await out.put(None)

    task = asyncio.create_task(run())
    try:
        while (message := await out.get()) is not None:
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                break
        await task
    finally:
        disconnected.set()
        if not task.done():
            try:
                await asyncio.wait_for(task, timeout=5)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - the client is gone either way
                task.cancel()

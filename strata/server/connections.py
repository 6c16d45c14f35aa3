"""The connection limit: at most --max-connections requests in flight, more is a 503.

A request is in flight from its first byte until its response has ended; a stream counts
until its last event. An HTTP/1.1 connection carries one request at a time, so this also
bounds the connections doing work, and with them the request bodies being buffered
(each at most --max-body-bytes). Idle keep-alive connections hold nothing and do not
count; uvicorn's own `limit_concurrency`, set above this limit by `strata serve`, bounds
them as a backstop (it answers a bare 503 text, this answers in the API's error shape).

/health and /metrics are not counted: they hold no body and no engine request, and an
overloaded server must look overloaded to its monitoring, not dead.
Invariant: `in_flight` is the number of counted requests between entry and exit (asyncio
thread only, so a plain integer).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from strata.server.errors import TooManyConnections, error_response

UNCOUNTED_PATHS = frozenset({"/health", "/metrics"})


class LimitConnections:
    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED_PATHS:
            return await self.app(scope, receive, send)
        if self.in_flight >= self.limit:
            return await error_response(TooManyConnections(self.limit))(scope, receive, send)
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

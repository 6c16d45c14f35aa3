"""The connection limit: at most --max-connections requests in flight, more is a 503.

A request is in flight from its first byte until its response has ended; a stream counts
until its last event. An HTTP/1.1 connection carries one request at a time, so this also
bounds the connections doing work, and with them the request bodies being buffered
(each at most --max-body-bytes). Idle keep-alive connections hold nothing and do not
count. Every request over the limit gets this answer, however many arrive at once: the
only bound before it is the listener's cap on open connections (`listener.py`), far above.
A refusal closes its connection (`Connection: close`), so a flood gives its sockets back.

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
            response = error_response(TooManyConnections(self.limit))
            response.headers["Connection"] = "close"
            return await response(scope, receive, send)
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

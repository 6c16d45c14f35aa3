"""The listening socket's side of the front door: uvicorn's configuration for `strata serve`.

Every request over --max-connections is answered by the app (`connections.py`: a 503
`too_many_connections` with Retry-After in the API's error shape, then the connection is
closed), however many arrive at once. uvicorn's own `limit_concurrency` is never set: it
counts open connections, idle and just-accepted ones included, and answers past its limit
with a bare text/plain 503 before the app sees the request (a burst of connections opened
together found every one of them over it).

The one hard cap is on open connections: past `open_connection_cap` (32 x --max-connections,
at least 1024, and never more than the file descriptors the process may open, less
FD_RESERVE for model and session files) a new connection is dropped as soon as it is
accepted, unanswered: a client that far past the limit is answered by nothing cheaper, and
the descriptors left keep /health, /metrics and the streams in flight working. `strata serve`
raises its soft descriptor limit to the hard one first.
"""

from __future__ import annotations

import asyncio
import logging
import resource

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from strata.server.settings import ServerSettings

log = logging.getLogger("strata.server")
OPEN_CONNECTIONS_FACTOR = 32
OPEN_CONNECTIONS_FLOOR = 1024
FD_RESERVE = 64


def raise_fd_limit() -> int:
    """Raises this process's soft limit on open files to its hard limit; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # a container may refuse: the cap below follows the limit that holds
    return soft


def open_connection_cap(max_connections: int, fd_limit: int) -> int:
    """Open connections past which a new one is dropped unanswered (see the module doc)."""
    wanted = max(OPEN_CONNECTIONS_FACTOR * max_connections, OPEN_CONNECTIONS_FLOOR)
    return max(max_connections + 1, min(wanted, fd_limit - FD_RESERVE))


def capped_protocol(cap: int) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, dropping a connection accepted while `cap` are open."""

    class CappedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        dropped = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= cap:
                self.dropped = True
                transport.abort()
                return
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            if not self.dropped:
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self.dropped:
                super().data_received(data)

    return CappedHTTPProtocol


def uvicorn_config(app, settings: ServerSettings, log_level: str = "warning", timeout_graceful_shutdown: int = 5,
                   fd_limit: int | None = None) -> uvicorn.Config:
    """The uvicorn configuration `strata serve` runs `app` with (the server tests use it too)."""
    if fd_limit is None:
        fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    cap = open_connection_cap(settings.max_connections, fd_limit)
    log.info("connections: %d in flight at most (--max-connections), %d open at most (more are dropped)",
             settings.max_connections, cap)
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                          timeout_graceful_shutdown=timeout_graceful_shutdown, http=capped_protocol(cap))

"""ASGI middleware: request counting, Host and Origin checks, API key, body size, JSON bodies.

The whole stack, outermost first, is in `app.py`: count, Host, Origin, CORS, connection
limit, API key, body size, JSON bodies. Auth runs before the body is read or parsed, so a
client without the key learns nothing about the request's validity; the body limit runs
before FastAPI parses JSON.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from strata.server.errors import (
    AuthError,
    BodyTooLarge,
    HostNotAllowed,
    OriginNotAllowed,
    UnsupportedMediaType,
    error_response,
)
from strata.server.hosts import HostPolicy
from strata.server.metrics import ServerMetrics
from strata.server.origins import OriginPolicy

# Routes anyone may call even with --api-key: liveness, the API's own description, and the
# browser app's files (the page asks for the key and sends it with each call it makes).
OPEN_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/"})
OPEN_PREFIXES = ("/ui/",)
# Routes counted under their own label; anything else is "other" (bounded label values).
KNOWN_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/models",
        "/health",
        "/metrics",
        "/slots",
        "/openapi.json",
        "/",
        "/monitor/feed",
    }
)


class CountRequests:
    def __init__(self, app: ASGIApp, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in KNOWN_ROUTES else "other"

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.http_requests.labels(route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


class CheckHost:
    """A Host header that names no address of this server is a 400 (`hosts.py` says which)."""

    def __init__(self, app: ASGIApp, policy: HostPolicy):
        self.app, self.policy = app, policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host")
            if host is not None and not self.policy.allows(host.decode("latin-1")):
                refusal = HostNotAllowed(host.decode("latin-1"))
                return await error_response(refusal)(scope, receive, send)
        await self.app(scope, receive, send)


class CheckOrigin:
    """A browser request from a site that is neither this server nor allowed is a 403
    (`origins.py` says which); requests without an Origin pass."""

    def __init__(self, app: ASGIApp, policy: OriginPolicy):
        self.app, self.policy = app, policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            origin = headers.get(b"origin")
            host = headers.get(b"host")
            if origin is not None and not self.policy.allows(
                origin.decode("latin-1"), None if host is None else host.decode("latin-1")
            ):
                refusal = OriginNotAllowed(origin.decode("latin-1"))
                return await error_response(refusal)(scope, receive, send)
        await self.app(scope, receive, send)


class RequireApiKey:
    """`Authorization: Bearer <key>`, the scheme in any case (RFC 7235), or `x-api-key: <key>`
    (Anthropic's header); the key compared in constant time (both sides hashed first, so not
    even the key's length shows)."""

    def __init__(self, app: ASGIApp, api_key: str | None):
        self.app = app
        self._expected = _digest(api_key.encode()) if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or self._expected is None or _is_open(path):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        given = headers.get(b"authorization", b"")
        scheme, _, credentials = given.strip().partition(b" ")
        bearer_ok = scheme.lower() == b"bearer" and hmac.compare_digest(
            _digest(credentials.strip()), self._expected
        )
        x_api_key = headers.get(b"x-api-key")
        x_ok = x_api_key is not None and hmac.compare_digest(
            _digest(x_api_key.strip()), self._expected
        )
        if not (bearer_ok or x_ok):
            message = (
                "a valid API key is required: send 'Authorization: Bearer <key>' "
                "(or 'x-api-key: <key>')"
            )
            if given or x_api_key is not None:
                message = "the API key is not valid"
            return await error_response(AuthError(message))(scope, receive, send)
        await self.app(scope, receive, send)


def _is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class LimitBody:
    """Reads the whole body first (at most `limit` bytes) and replays it to the app.

    A declared Content-Length over the limit is refused before reading anything. After the
    body, `receive` passes through, so handlers still see `http.disconnect`.
    """

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await error_response(BodyTooLarge(self.limit))(scope, receive, send)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await error_response(BodyTooLarge(self.limit))(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class JsonBodies:
    """POST bodies are JSON whatever a non-browser client declared: `curl -d` sends them as
    a form.

    Without an Origin header, a missing Content-Type or curl's default
    `application/x-www-form-urlencoded` becomes `application/json` (as llama.cpp's server
    reads them); any other type is left alone. A request with an Origin comes from a
    browser, where a form or text body needs no CORS preflight: it must declare
    `application/json` (which does need one), anything else is a 415.
    """

    LENIENT = (b"", b"application/x-www-form-urlencoded")

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            given = dict(scope["headers"])
            declared = given.get(b"content-type", b"").split(b";")[0].strip().lower()
            if b"origin" in given and declared != b"application/json":
                refusal = UnsupportedMediaType(
                    "a request from a web page must send its body as application/json, "
                    f"not {declared.decode('latin-1') or 'without a Content-Type'}"
                )
                return await error_response(refusal)(scope, receive, send)
            if declared in self.LENIENT:
                headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)

"""ASGI middleware, outermost first: request counting, API key, body size limit, JSON bodies.

Auth runs before the body is read or parsed, so a client without the key learns nothing
about the request's validity; the body limit runs before FastAPI parses JSON.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from strata.server.errors import AuthError, BodyTooLarge, error_response
from strata.server.metrics import ServerMetrics

# Routes anyone may call even with --api-key: liveness, and the API's own description.
OPEN_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
# Routes counted under their own label; anything else is "other" (bounded label values).
KNOWN_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/health",
        "/metrics",
        "/slots",
        "/openapi.json",
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


class RequireApiKey:
    def __init__(self, app: ASGIApp, api_key: str | None):
        self.app = app
        self._expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._expected is None or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self._expected):
            message = "a valid API key is required: send 'Authorization: Bearer <key>'"
            if given:
                message = "the API key is not valid"
            return await error_response(AuthError(message))(scope, receive, send)
        await self.app(scope, receive, send)


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
    """POST bodies are JSON whatever the client declared: `curl -d` sends them as a form.

    A missing Content-Type, or curl's default `application/x-www-form-urlencoded`, becomes
    `application/json` (as llama.cpp's server reads them); any other type is left alone.
    """

    LENIENT = (b"", b"application/x-www-form-urlencoded")

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            declared = dict(scope["headers"]).get(b"content-type", b"")
            if declared.split(b";")[0].strip().lower() in self.LENIENT:
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)

"""Errors in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.

Every error is first made the server's way (`strata.server.errors`: one place decides the
status, the message and Retry-After); on the Messages routes `AnthropicErrors` rewrites the
body into Anthropic's shape and a 503 into Anthropic's 529 `overloaded_error`, whichever
layer refused (Host, Origin, connections, API key, body size, validation, the engine):

| server status | Anthropic status | error.type |
| --- | --- | --- |
| 400, 405, 415 | same | invalid_request_error |
| 401 | 401 | authentication_error |
| 403 | 403 | permission_error |
| 404 | 404 | not_found_error |
| 413 | 413 | request_too_large |
| 503 (pool full, queue full, connections, loading; Retry-After kept) | 529 | overloaded_error |
| 500 (the message names the incident id the log has) | 500 | api_error |
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from strata.server.errors import error_body, status_of

PREFIX = "/v1/messages"
OVERLOADED = 529
KINDS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    OVERLOADED: "overloaded_error",
}


def anthropic_status(status: int) -> int:
    return OVERLOADED if status == 503 else status


def anthropic_error(status: int, server_error: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's error body for the server's `error` object sent with `status`."""
    status = anthropic_status(status)
    kind = KINDS.get(status, "api_error" if status >= 500 else "invalid_request_error")
    message = str(server_error.get("message", ""))
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_event_payload(exc: BaseException) -> dict[str, Any]:
    """The data of a stream's `error` event for `exc`."""
    return anthropic_error(status_of(exc), error_body(exc))


def is_messages_route(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class AnthropicErrors:
    """ASGI middleware: on the Messages routes, an error answer (status >= 400, a JSON body
    with an `error` object) is rewritten into Anthropic's shape and status. Successful
    answers and streams pass through untouched."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_messages_route(scope["path"]):
            return await self.app(scope, receive, send)
        start: Message | None = None
        body: list[bytes] = []

        async def rewriting_send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                return await send(message)
            body.append(message.get("body", b""))
            if not message.get("more_body", False):
                await _send_rewritten(send, start, b"".join(body))

        await self.app(scope, receive, rewriting_send)


async def _send_rewritten(send: Send, start: Message, raw: bytes) -> None:
    status = start["status"]
    try:
        found = json.loads(raw)
    except ValueError:
        found = None
    if not isinstance(found, dict) or not isinstance(found.get("error"), dict):
        await send(start)
        await send({"type": "http.response.body", "body": raw})
        return
    new = json.dumps(anthropic_error(status, found["error"])).encode()
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(new)).encode()))
    await send({**start, "status": anthropic_status(status), "headers": headers})
    await send({"type": "http.response.body", "body": new})

"""Errors over HTTP, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every error a client sees goes through `error_body` and `status_of`, so the status code,
the `type` and the `Retry-After` header always agree:

| error | status | type |
| --- | --- | --- |
| RequestError (incl. context_length_exceeded), HostNotAllowed | 400 | invalid_request_error |
| AuthError | 401 | invalid_request_error (code invalid_api_key) |
| OriginNotAllowed | 403 | invalid_request_error |
| ModelNotFound, unknown path | 404 | invalid_request_error / not_found_error |
| LaneBusy (a slot serving a request) | 409 | invalid_request_error (code slot_busy) |
| SlotFilesOff (no --slot-save-path) | 403 | invalid_request_error (code not_supported) |
| BodyTooLarge | 413 | invalid_request_error |
| UnsupportedMediaType | 415 | invalid_request_error |
| PoolFullError, QueueFullError, NotReady, TooManyConnections | 503 | unavailable_error |

(every 503 carries Retry-After)
| anything else (ServerError included) | 500 | server_error |

A 500 never shows the exception's text: the client gets a fixed message and an incident
id (`err-<hex>`), and the log gets the details under the same id (`incidents.py`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from strata.errors import LaneBusy, PoolFullError, SlotFilesOff, QueueFullError, RequestError, StepFailed, StrataError
from strata.server.incidents import incident_id
from strata.server.validation import shorten, validation_message


class ModelNotFound(RequestError):
    def __init__(self, requested: str, served: str):
        super().__init__(
            f"the model {requested!r} is not served here; this server serves {served!r}",
            code="model_not_found",
            param="model",
        )


class AuthError(StrataError):
    code = "invalid_api_key"

    def __init__(
        self, message: str = "a valid API key is required: send 'Authorization: Bearer <key>'"
    ):
        super().__init__(message)


class BodyTooLarge(StrataError):
    code = "request_too_large"

    def __init__(self, limit: int):
        super().__init__(f"the request body is larger than --max-body-bytes {limit}")


class NotReady(StrataError):
    """The model is still loading, or failed to load (503 + Retry-After)."""

    def __init__(self, message: str, code: str = "model_loading", retry_after: int = 1):
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after


class ServerError(StrataError):
    """Something broke inside the server. Its message goes to the log, never to a client."""

    code = "internal_error"


class HostNotAllowed(StrataError):
    """The Host header names no address this server listens on (DNS rebinding guard)."""

    code = "invalid_host"

    def __init__(self, host: str):
        super().__init__(
            f"the Host header {shorten(host)!r} is not an address this server answers to "
            "(start it with --allow-host NAME to accept that name)"
        )


class OriginNotAllowed(StrataError):
    """A browser request from another site that --allow-origin does not name."""

    code = "origin_not_allowed"

    def __init__(self, origin: str):
        super().__init__(
            f"requests from the web origin {shorten(origin)!r} are not allowed "
            "(start the server with --allow-origin ORIGIN to allow it)"
        )


class UnsupportedMediaType(StrataError):
    code = "unsupported_media_type"

    def __init__(self, message: str):
        super().__init__(message)


class TooManyConnections(StrataError):
    """More requests in flight than --max-connections (503 + Retry-After)."""

    code = "too_many_connections"

    def __init__(self, limit: int, retry_after: int = 1):
        super().__init__(
            f"the server is handling its limit of {limit} requests (--max-connections); "
            f"retry in {retry_after} s"
        )
        self.retry_after = retry_after


# Every error a client can see, by type, and its HTTP status; an error takes the status of the
# nearest type in its class hierarchy that the table names (ModelNotFound before RequestError).
HTTP_STATUS: dict[type[BaseException], int] = {
    RequestError: 400,
    HostNotAllowed: 400,
    AuthError: 401,
    SlotFilesOff: 403,
    OriginNotAllowed: 403,
    ModelNotFound: 404,
    LaneBusy: 409,
    BodyTooLarge: 413,
    UnsupportedMediaType: 415,
    PoolFullError: 503,
    QueueFullError: 503,
    NotReady: 503,
    TooManyConnections: 503,
}


def status_of(exc: BaseException) -> int:
    """The status of `exc` by HTTP_STATUS; 500 for anything it does not name."""
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500


def retry_after_of(exc: BaseException) -> int | None:
    return getattr(exc, "retry_after", None) if status_of(exc) == 503 else None


def error_body(exc: BaseException) -> dict[str, Any]:
    """The `error` object for `exc` (also the payload of an SSE error event).

    Invariant: a 500's body holds no text of the exception, only its incident id.
    """
    status = status_of(exc)
    if isinstance(exc, StepFailed):  # its message is the engine's own, naming the logged id
        return {"message": str(exc), "type": "server_error", "param": None, "code": exc.code, "id": exc.error_id}
    if status == 500:
        error_id = incident_id(exc)
        return {
            "message": f"internal server error (incident {error_id}; the server log has details)",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
            "id": error_id,
        }
    kind = "unavailable_error" if status == 503 else "invalid_request_error"
    body: dict[str, Any] = {
        "message": str(exc),
        "type": kind,
        "param": getattr(exc, "param", None),
        "code": getattr(exc, "code", None),
    }
    retry_after = retry_after_of(exc)
    if retry_after is not None:
        body["retry_after"] = retry_after
    return body


def error_response(exc: BaseException) -> JSONResponse:
    status = status_of(exc)
    headers = {}
    retry_after = retry_after_of(exc)
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse({"error": error_body(exc)}, status_code=status, headers=headers)


def plain_error(
    status: int, message: str, kind: str, code: str | None, param: str | None = None
) -> JSONResponse:
    body = {"message": message, "type": kind, "param": param, "code": code}
    return JSONResponse({"error": body}, status_code=status)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_message(list(exc.errors())))

    @app.exception_handler(StrataError)
    async def _strata(request: Request, exc: StrataError) -> JSONResponse:
        if status_of(exc) == 500:  # logged under its incident id, with where it happened
            incident_id(exc, f"{request.method} {request.url.path}")
        response = error_response(exc)
        # Starlette re-raises the exception after this response, and uvicorn then closes
        # the connection: say so, so that a client does not send its next request on it.
        response.headers["Connection"] = "close"
        return response

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = (
            f"no route {request.method} {request.url.path}"
            if exc.status_code in (404, 405)
            else str(exc.detail)
        )
        return plain_error(exc.status_code, message, kind, code=str(exc.status_code))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Logged with its traceback under the incident id the response carries.
        incident_id(exc, f"{request.method} {request.url.path}")
        response = error_response(exc)
        # Starlette re-raises the exception after this response, and uvicorn then closes
        # the connection: say so, so that a client does not send its next request on it.
        response.headers["Connection"] = "close"
        return response

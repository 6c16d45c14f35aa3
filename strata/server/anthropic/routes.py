"""The Messages routes: POST /v1/messages and POST /v1/messages/count_tokens.

The same checks as the OpenAI routes, in the same order (middleware first, then readiness
and queue capacity before tokenizing); errors leave in Anthropic's shape (`errors.py`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from strata.server.anthropic.params import messages_job, prompt_ids
from strata.server.anthropic.requests import (
    FIELD_POLICY,
    CountTokensRequest,
    MessagesRequest,
)
from strata.server.anthropic.response import MessagesResponse
from strata.server.anthropic.shapes import MessageFormat
from strata.server.reasoning import MARKERS
from strata.server.respond import respond
from strata.server.anthropic.shapes import ErrorBody, MessageBody, TokenCount

ERRORS = {
    400: {"model": ErrorBody, "description": "invalid_request_error"},
    401: {"model": ErrorBody, "description": "authentication_error"},
    403: {"model": ErrorBody, "description": "permission_error (a web origin not allowed)"},
    404: {"model": ErrorBody, "description": "not_found_error (unknown model)"},
    413: {"model": ErrorBody, "description": "request_too_large"},
    415: {"model": ErrorBody, "description": "invalid_request_error (a browser body not JSON)"},
    529: {
        "model": ErrorBody,
        "description": "overloaded_error: KV pool full, queue full, too many connections or "
        "loading (retry-after)",
    },
}
STREAM = {
    "content": {"text/event-stream": {}},
    "description": "with stream: true, Anthropic's server-sent events",
}

router = APIRouter()


@router.post(
    "/v1/messages",
    response_model=MessageBody,
    responses={**ERRORS, 200: STREAM},
    description=f"Anthropic's Messages API.\n\n{FIELD_POLICY}",
)
async def messages(body: MessagesRequest, request: Request) -> Response:
    state = request.app.state.strata
    info = state.loop.check_ready()
    state.loop.check_capacity()  # before tokenizing: a full server does no work for it
    job = await run_in_threadpool(messages_job, body, info)
    assert job.params.max_tokens is not None  # required by the Messages API

    def fmt_for(request_id: str) -> MessagesResponse:
        template = info.tokenizer.chat_template or ""
        eager = job.tools is None and not any(o in template for o, _ in MARKERS)
        return MessagesResponse(MessageFormat(request_id, info.model_id, job.params.max_tokens,
                                              len(job.prompt.token_ids), job.shape), eager)

    return await respond(request, state.loop, job, fmt_for, state.settings.sse_keepalive_s)


@router.post("/v1/messages/count_tokens", response_model=TokenCount, responses=ERRORS)
async def count_tokens(body: CountTokensRequest, request: Request) -> TokenCount:
    """The prompt's length in tokens, as /v1/messages would read it."""
    info = request.app.state.strata.loop.check_ready()
    ids = await run_in_threadpool(prompt_ids, body, info)
    return TokenCount(input_tokens=len(ids))

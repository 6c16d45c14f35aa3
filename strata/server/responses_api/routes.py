"""POST /v1/responses: OpenAI's Responses API, streamed or whole, over the chat machinery
(the same checks in the same order as /v1/chat/completions)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from strata.server.respond import respond
from strata.server.responses_api.params import responses_job
from strata.server.responses_api.requests import __doc__ as FIELD_POLICY
from strata.server.responses_api.requests import ResponsesRequest
from strata.server.responses_api.response import ResponsesFormat
from strata.server.responses_api.store import ResponseStore
from strata.server.routes import ERRORS, STREAM, state_of

router = APIRouter()


def store_of(request: Request) -> ResponseStore:
    return request.app.state.responses  # made by create_app


@router.post("/v1/responses", responses={**ERRORS, 200: STREAM}, description=FIELD_POLICY)
async def responses(body: ResponsesRequest, request: Request) -> Response:
    state = state_of(request)
    info = state.loop.check_ready()
    state.loop.check_capacity()  # before tokenizing: a full server does no work for it
    store = store_of(request)
    job, conversation = await run_in_threadpool(responses_job, body, info, store)
    echo = {
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "previous_response_id": body.previous_response_id, "temperature": body.temperature,
        "top_p": body.top_p, "parallel_tool_calls": body.parallel_tool_calls is not False,
        "tool_choice": body.tool_choice or ("auto" if body.tools else "none"), "tools": body.tools or [],
        "text": {"format": {"type": "text"}} if body.text is None or body.text.format is None
        else {"format": body.text.format.model_dump(by_alias=True, exclude_none=True)},
        "metadata": body.metadata or {}, "store": body.store is not False, "user": body.user,
        "truncation": "disabled", "reasoning": None,
    }

    def fmt_for(request_id: str) -> ResponsesFormat:
        return ResponsesFormat(store.response_id(request_id), info.model_id, job.shape, echo, conversation,
                               store if body.store is not False else None)

    return await respond(request, state.loop, job, fmt_for, state.settings.sse_keepalive_s)

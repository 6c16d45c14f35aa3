"""The HTTP routes. Handlers are thin: validate (pydantic + params), then hand over to
`respond.respond`, or read the engine thread's latest snapshot.

Order of the checks a generation request passes (cheapest first; the middleware does the
first ones): Host, Origin (and CORS), connection limit, API key, Content-Type, body
size, JSON parsing; then here readiness and queue capacity, and only then tokenizing and
the chat template.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from strata.engine.interface import EngineSnapshot
from strata.server.engine_loop import EngineLoop
from strata.server.errors import NotReady
from strata.server.chat_format import ChatFormat
from strata.server.formats import CompletionFormat, OpenAIResponse, TokenText
from strata.server.metrics import ServerMetrics
from strata.server.params import Job, ModelInfo, chat_job, completion_job
from strata.server.requests import ChatCompletionRequest, CompletionRequest
from strata.server.respond import respond
from strata.server.responses import (
    ChatCompletion,
    Completion,
    ErrorResponse,
    Health,
    ModelCard,
    ModelList,
    Slot,
)
from strata.server.settings import ServerSettings


@dataclass(frozen=True)
class ServerState:
    """Everything a handler may use; one per app, made by `create_app`."""

    settings: ServerSettings
    loop: EngineLoop
    metrics: ServerMetrics
    model_id: str
    created: int


def state_of(request: Request) -> ServerState:
    return request.app.state.strata


ERRORS = {
    400: {"model": ErrorResponse, "description": "a malformed or unsupported request"},
    401: {"model": ErrorResponse, "description": "missing or wrong API key"},
    403: {"model": ErrorResponse, "description": "a web origin --allow-origin does not name"},
    404: {"model": ErrorResponse, "description": "unknown model"},
    413: {"model": ErrorResponse, "description": "body over --max-body-bytes"},
    415: {"model": ErrorResponse, "description": "a browser body that is not JSON"},
    503: {
        "model": ErrorResponse,
        "description": "loading, KV pool full, too many waiting or too many connections "
        "(Retry-After)",
    },
}
STREAM = {
    "content": {"text/event-stream": {}},
    "description": "with stream: true, server-sent events",
}

router = APIRouter()


def _format(kind: type, info: ModelInfo, job: Job):
    """`request_id -> ResponseFormat` for one OpenAI endpoint."""
    tokens = TokenText(info.tokenizer)

    def make(request_id: str) -> OpenAIResponse:
        extra = {"shape": job.shape} if kind is ChatFormat else {}
        fmt = kind(request_id, model=info.model_id, fingerprint=info.fingerprint, tokens=tokens,
                   want_logprobs=job.want_logprobs, n=job.n, **extra)
        return OpenAIResponse(fmt, job.include_usage)

    return make


@router.post(
    "/v1/chat/completions", response_model=ChatCompletion, responses={**ERRORS, 200: STREAM}
)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    state = state_of(request)
    info = state.loop.check_ready()
    state.loop.check_capacity()  # before tokenizing: a full server does no work for it
    job = await run_in_threadpool(chat_job, body, info)
    fmt = _format(ChatFormat, info, job)
    return await respond(request, state.loop, job, fmt, state.settings.sse_keepalive_s)


@router.post("/v1/completions", response_model=Completion, responses={**ERRORS, 200: STREAM})
async def completions(body: CompletionRequest, request: Request) -> Response:
    state = state_of(request)
    info = state.loop.check_ready()
    state.loop.check_capacity()  # before tokenizing: a full server does no work for it
    job = await run_in_threadpool(completion_job, body, info)
    fmt = _format(CompletionFormat, info, job)
    return await respond(request, state.loop, job, fmt, state.settings.sse_keepalive_s)


@router.get("/v1/models", response_model=ModelList, responses=ERRORS)
async def models(request: Request) -> ModelList:
    state = state_of(request)
    info = state.loop.check_ready()
    return ModelList(
        data=[ModelCard(id=info.model_id, created=state.created, max_model_len=info.max_context)]
    )


@router.get("/health", response_model=Health, responses={503: ERRORS[503]})
async def health(request: Request) -> Health:
    """200 once the model is loaded; 503 while it loads (or if loading failed)."""
    state_of(request).loop.check_ready()
    return Health(status="ok")


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, 401: ERRORS[401], 403: ERRORS[403]},
)
async def metrics(request: Request) -> Response:
    """Prometheus text: requests, tokens, latencies, and the KV pool (after loading)."""
    return Response(state_of(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


def _slot_moe(moe: dict | None, lane: int) -> dict | None:
    if moe is None:
        return None
    rings = (moe["budget"] or {}).get("ring_cells", {})
    return {"expert_slots": moe["resident"], "hit_ratio": moe["hit_ratio"],
            "bytes_copied_per_token": moe["bytes_copied_per_token"], "budget_ring_cells": rings.get(str(lane))}


def _slot_window_groups(snap: EngineSnapshot, lane: int) -> list[dict] | None:
    """Each windowed layer group's chunks for lane `lane` and the group's pool (None without groups)."""
    layers = snap.group_layers[1:]
    assert len(layers) == len(snap.pool.groups), "a windowed group without its layers"
    return [{"window": g.window, "layers": n, "chunks_held": g.chunks_per_lane[lane],
             "chunks_kept": g.kept_per_lane[lane], "kept_windows": g.kept_windows_per_lane[lane],
             "group_chunks_total": g.num_chunks_total, "group_chunks_free": g.num_chunks_free}
            for g, n in zip(snap.pool.groups, layers)] or None


@router.get("/slots", response_model=list[Slot], responses=ERRORS)
async def slots(request: Request) -> JSONResponse:
    """Each lane: its state, conversation length and chunks held."""
    loop = state_of(request).loop
    loop.check_ready()
    snap = loop.snapshot
    if snap is None:
        raise NotReady("the engine has not reported yet")
    body = [
        Slot(
            id=lane.index,
            state=lane.state,
            n_ctx=snap.max_context,
            conversation_tokens=lane.num_cells,
            chunks_held=lane.num_chunks,
            chunks_shared=lane.num_chunks_shared,
            request_id=lane.request_id,
            prompt_tokens=lane.num_prompt_tokens,
            output_tokens=lane.num_output_tokens,
            ring=lane.ring,
            spec=lane.spec,
            moe=_slot_moe(snap.moe, lane.index),
            window_groups=_slot_window_groups(snap, lane.index),
        ).model_dump()
        for lane in snap.lanes
    ]
    return JSONResponse(body)

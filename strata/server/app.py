"""The app factory: one FastAPI app, one engine loop, one metrics registry; no globals."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from strata import __version__
from strata.config import heap_trim_seconds
from strata.engine.interface import Engine
from strata.kv.session_disk import remove_leftovers
from strata.server import requests
from strata.server.anthropic.errors import AnthropicErrors
from strata.server.anthropic.routes import router as anthropic_router
from strata.server.connections import LimitConnections
from strata.server.engine_loop import EngineLoop
from strata.server.errors import install_handlers
from strata.server.heap import HeapTrim
from strata.server.hosts import HostPolicy
from strata.server.metrics import ServerMetrics
from strata.server.monitor.routes import router as monitor_router
from strata.server.middleware import (
    CheckHost,
    CheckOrigin,
    CountRequests,
    JsonBodies,
    LimitBody,
    RequireApiKey,
)
from strata.server.origins import OriginPolicy
from strata.server.routes import ServerState, router
from strata.server.slots import slots_router
from strata.server.settings import ServerSettings
from strata.server.responses_api.routes import router as responses_router
from strata.server.responses_api.store import ResponseStore
from strata.server.utility_routes import router as utility_router
from strata.server.webapp.routes import router as webapp_router

DESCRIPTION = f"""OpenAI-compatible API over strata's lanes and shared KV pool.

Besides OpenAI's fields, responses carry `timings` (llama.cpp's names) and `truncated`
on a choice the KV pool could not grow. A full pool at admission is a 503 `kv_pool_full`
with `Retry-After`.

Request fields:

{requests.FIELD_POLICY}"""


def create_app(
    settings: ServerSettings,
    load_engine: Callable[[], Engine],
    model_id: str,
    on_load_error: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """`load_engine` runs on the engine thread when the app starts; /health is 503 until it returns."""
    metrics = ServerMetrics()
    loop = EngineLoop(load_engine, model_id, metrics, settings.max_waiting, on_load_error,
                      HeapTrim(heap_trim_seconds(os.environ)), settings.tool_call_parser, settings.reasoning_format)
    metrics.add_pool(lambda: loop.snapshot)
    state = ServerState(
        settings=settings, loop=loop, metrics=metrics, model_id=model_id, created=int(time.time())
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.slot_save_path is not None:  # what a save killed mid-file left (kv/session_disk.py)
            remove_leftovers(settings.slot_save_path)
        loop.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(loop.stop)

    app = FastAPI(
        title="strata",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.strata = state
    app.state.responses = ResponseStore()  # /v1/responses kept for previous_response_id
    install_handlers(app)
    app.include_router(router)
    app.include_router(slots_router)
    app.include_router(utility_router)  # /tokenize, /detokenize, /apply-template, /props
    app.include_router(responses_router)  # /v1/responses
    app.include_router(anthropic_router)
    app.include_router(monitor_router)  # /monitor/feed, the live picture of the pool
    app.include_router(webapp_router)  # / and /ui/*: the browser app (chat and monitor)
    # add_middleware wraps: the last added runs first. So a request meets, in order: the
    # counter (every answer is counted), the Host check, the Origin check, CORS (so every
    # answer after it, refusals included, carries CORS headers for an allowed origin, and
    # preflights are answered before auth), the connection limit, the API key, the
    # Content-Type rule, the body limit; then FastAPI parses JSON and the route checks
    # readiness and queue capacity before it tokenizes.
    app.add_middleware(LimitBody, limit=settings.max_body_bytes)
    app.add_middleware(JsonBodies)
    app.add_middleware(RequireApiKey, api_key=settings.api_key)
    app.add_middleware(LimitConnections, limit=settings.max_connections)
    if settings.allow_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.allow_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["*"],  # SDKs send their own headers; no cookies are honoured
            expose_headers=["Retry-After"],
            max_age=600,
        )
    app.add_middleware(CheckOrigin, policy=OriginPolicy(frozenset(settings.allow_origins)))
    app.add_middleware(CheckHost, policy=HostPolicy.for_bind(settings.host, settings.allow_hosts))
    app.add_middleware(AnthropicErrors)  # /v1/messages: every refusal above in Anthropic's shape
    app.add_middleware(CountRequests, metrics=metrics)
    return app

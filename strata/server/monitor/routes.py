"""The monitor's route: `GET /monitor/feed`, the live picture of the pool (see feed.py).

It needs the API key like every route but /health (the page sends it as a Bearer header,
reading the stream with fetch: EventSource cannot send headers), and passes the Host and
Origin checks like the API. It stays out of /openapi.json: a stream that never ends is no
operation for generated clients or the fuzzer.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from strata.server.monitor.feed import frames
from strata.server.monitor.history import History
from strata.server.sse import EventStream

router = APIRouter()


def history_of(request: Request) -> History:
    app_state = request.app.state
    if getattr(app_state, "strata_history", None) is None:
        state = app_state.strata
        app_state.strata_history = History(state.metrics.generation_tokens, lambda: state.loop.snapshot)
    return app_state.strata_history


@router.get("/monitor/feed", include_in_schema=False)
async def monitor_feed(request: Request) -> Response:
    state = request.app.state.strata
    history = history_of(request)
    history.start()
    watch = state.loop.pool_watch
    watch.watchers += 1
    state.loop.wake()  # an idle engine takes its first picture now

    def release() -> None:
        watch.watchers -= 1

    # Set by whoever runs uvicorn (`strata serve`): True once the server is shutting down.
    stopping = getattr(request.app.state, "strata_stopping", None) or (lambda: False)
    return EventStream(frames(state.loop, history, state.model_id, stopping), on_close=release)

"""The cluster's front door: one HTTP endpoint, requests forwarded to strata replicas.

It reads just enough of a request to route it: the prompt's token ids (through the same
request models and chat template as `strata serve`, so the keys are the ones the
replica's engine will hold), their prefix keys, and the cells the turn adds. Anything it
cannot read is forwarded as is: the replica's app answers it, errors included. Headers
added to every answer: `x-strata-replica` (who served it), `x-strata-route` (why), and
`x-strata-migrated-tokens` when the prompt's prefix came from another replica, and
`x-strata-router-seq`: the number of the serving replica's routing report the router routed
by (its answers' `x-strata-report-seq` says how many it had made: a turn is in every report
numbered two past that one's).

A replica that dies ends only the requests it was serving: before the answer started,
a 503 `replica_failed` with Retry-After (clients retry it); mid-stream, an SSE error
event in the route's shape. GET /metrics is the front door's own (routing); with an
`x-strata-replica` header, any request goes to that replica (its /metrics, /slots). A
Responses API follow-up (`previous_response_id`) goes to the replica that made that response
(its id names it: responses_api/store.py), the one that holds its conversation; where that
replica is gone, any replica answers it (a 400 `previous_response_not_found`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from strata.cluster.forward import ForwardedRequest, ResponseStart
from strata.cluster.keys import prefix_keys
from strata.cluster.metrics import FrontMetrics
from strata.server.anthropic.errors import anthropic_status, error_event_payload, is_messages_route
from strata.errors import RequestError
from strata.server.errors import BodyTooLarge, NotReady, error_body, error_response
from strata.server.params import ModelInfo

log = logging.getLogger("strata.cluster")
PIN_HEADER = "x-strata-replica"
ROUTER_SEQ_HEADER = b"x-strata-router-seq"
METRICS_TIMEOUT_S = 10.0  # per replica, for the front door's /metrics
PROMPT_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses")


def replica_failed() -> NotReady:
    return NotReady("the replica serving this request failed; retry it", code="replica_failed", retry_after=1)


def routing_fields(req: ForwardedRequest, info: ModelInfo, block: int, text: bool = False) -> None:
    """Fills `req`'s prompt ids, prefix keys and cells when it is a readable generation request
    (and with `text`, the prompt's text: what Ray's own prefix router matches)."""
    from strata.server.anthropic.params import prompt_ids as messages_prompt_ids
    from strata.server.anthropic.requests import MessagesRequest
    from strata.server.params import chat_job, completion_job
    from strata.server.requests import ChatCompletionRequest, CompletionRequest
    from strata.server.responses_api.params import responses_job
    from strata.server.responses_api.requests import ResponsesRequest
    from strata.server.responses_api.store import ResponseStore

    if req.method != "POST" or req.path not in PROMPT_PATHS:
        return
    try:
        body = json.loads(req.body)
        n = 1
        if req.path == "/v1/messages":
            m = MessagesRequest.model_validate(body)
            ids, max_tokens = messages_prompt_ids(m, info), m.max_tokens
        elif req.path == "/v1/responses":  # a follow-up (previous_response_id) is read by its replica only
            job, _ = responses_job(ResponsesRequest.model_validate(body), info, ResponseStore())
            ids, max_tokens = job.prompt.token_ids, job.params.max_tokens
        else:
            job = (chat_job(ChatCompletionRequest.model_validate(body), info) if req.path == "/v1/chat/completions"
                   else completion_job(CompletionRequest.model_validate(body), info))
            ids, max_tokens, n = job.prompt.token_ids, job.params.max_tokens, job.n
    except Exception:  # noqa: BLE001 - the replica answers it with the proper error
        return
    req.prompt_ids = list(ids)
    req.prefix_keys = prefix_keys(req.prompt_ids, block)
    # n choices share the prompt's cells and each takes its own new ones
    req.num_new_cells = len(ids) + n * ((max_tokens if max_tokens is not None else 0) + 1)
    if text:
        req.prompt = info.tokenizer.decode(req.prompt_ids)


def previous_response_owner(req: ForwardedRequest) -> str | None:
    """The replica that made the response a Responses API request follows up, if it names one."""
    from strata.server.responses_api.store import owner_of

    if req.method != "POST" or req.path != "/v1/responses":
        return None
    try:
        previous = json.loads(req.body).get("previous_response_id")
    except (ValueError, AttributeError):
        return None
    return owner_of(previous) if isinstance(previous, str) else None


class FrontDoor:
    """Serve's ingress deployment (see app.py): `__call__` takes every HTTP request."""

    def __init__(self, replicas, model_path: str | None, model_id: str, block: int, api_key: str | None,
                 max_body_bytes: int, prompt_text: bool = False):
        from strata.loader import open_model

        source = open_model(model_path)
        self.info = ModelInfo(model_id, source.tokenizer, 1 << 30, source.config.vocab_size, source.fingerprint)
        self.replicas = replicas
        self.block = block
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.prompt_text = prompt_text  # the ray_prefix policy routes by the prompt's text
        self.metrics = FrontMetrics()

    async def __call__(self, request: Request) -> Response:
        body = bytearray()
        async for piece in request.stream():  # never more than --max-body-bytes held here
            body += piece
            if len(body) > self.max_body_bytes:
                return error_response(BodyTooLarge(self.max_body_bytes))
        body = bytes(body)
        pin = request.headers.get(PIN_HEADER)
        authorized = self.api_key is None or request.headers.get("authorization") == f"Bearer {self.api_key}" \
            or request.headers.get("x-api-key") == self.api_key  # else a replica answers the 401
        if request.url.path == "/metrics" and pin is None and authorized:
            return Response(self.metrics.render(await self._replica_metrics(request)),
                            media_type="text/plain; version=0.0.4")
        if pin is not None and pin not in await self._replica_ids():
            return error_response(RequestError(f"no replica {pin!r} in this cluster", code="replica_not_found",
                                               param=PIN_HEADER))
        req = ForwardedRequest(request.method, request.url.path, request.url.query.encode(),
                               list(request.headers.raw), body, pin=pin)
        if authorized:
            routing_fields(req, self.info, self.block, self.prompt_text)  # unauthenticated requests cost no tokenizing
            owner = previous_response_owner(req)
            if pin is None and owner is not None and owner in await self._replica_ids():
                req.pin = owner
        gen = self.replicas.options(stream=True).forward.remote(req)
        try:
            start: ResponseStart = await gen.__anext__()
        except StopAsyncIteration:
            return self._failed(req.path)
        except Exception as exc:  # noqa: BLE001 - the replica died or became unreachable
            log.warning("replica failed before answering %s: %s", req.path, exc)
            return self._failed(req.path)
        self.metrics.requests.labels(start.replica, req.route).inc()
        if start.migrated_tokens:
            self.metrics.migrations.inc()
            self.metrics.migrated.inc(start.migrated_tokens)
        headers = dict((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in start.headers)
        routed = [(ROUTER_SEQ_HEADER, str(req.report_seq).encode())] if req.report_seq is not None else []
        if headers.get("content-type", "").startswith("text/event-stream"):
            response = StreamingResponse(self._stream(gen, req.path), status_code=start.status)
            response.raw_headers = [(k, v) for k, v in start.headers if k.lower() != b"content-length"] + routed
            return response
        try:
            content = b"".join([piece async for piece in gen])
        except Exception as exc:  # noqa: BLE001
            log.warning("replica %s failed while answering %s: %s", start.replica, req.path, exc)
            return self._failed(req.path)
        response = Response(content, status_code=start.status)
        response.raw_headers = start.headers + routed
        return response

    async def _replica_ids(self) -> list[str]:
        """The replicas Ray knows by name (a GCS call, off the event loop)."""
        from strata.cluster.app import replica_ids

        return await asyncio.to_thread(replica_ids, self.replicas.app_name, self.replicas.deployment_name)

    async def _replica_metrics(self, request: Request) -> dict[str, str]:
        """Each running replica's /metrics (one that does not answer in time is left out)."""
        ids = await self._replica_ids()

        async def one(replica: str) -> str | None:
            req = ForwardedRequest("GET", "/metrics", b"", list(request.headers.raw), b"", pin=replica)
            async def answer() -> list:
                return [p async for p in self.replicas.options(stream=True).forward.remote(req)]

            try:
                pieces = await asyncio.wait_for(answer(), METRICS_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - gone, starting or stuck: the others still count
                log.info("replica %s left out of /metrics: %s", replica, exc)
                return None
            return b"".join(pieces[1:]).decode() if pieces and pieces[0].status == 200 else None

        # One after another: pinned requests routed at once were seen waiting on each other.
        texts = {r: await one(r) for r in ids}
        return {r: t for r, t in texts.items() if t is not None}

    async def _stream(self, gen, path: str) -> AsyncIterator[bytes]:
        try:
            async for piece in gen:
                yield piece
        except Exception as exc:  # noqa: BLE001 - mid-stream: an error event ends this stream only
            log.warning("replica failed mid-stream on %s: %s", path, exc)
            self.metrics.failures.inc()
            if is_messages_route(path):
                yield f"event: error\ndata: {json.dumps(error_event_payload(replica_failed()))}\n\n".encode()
            else:
                yield f"data: {json.dumps({'error': error_body(replica_failed())})}\n\n".encode()
        finally:
            gen.cancel()  # a client that left: the replica's app sees the disconnect

    def _failed(self, path: str) -> Response:
        self.metrics.failures.inc()
        response = error_response(replica_failed())
        if is_messages_route(path):
            return JSONResponse(error_event_payload(replica_failed()), status_code=anthropic_status(503),
                                headers={"Retry-After": "1"})
        return response

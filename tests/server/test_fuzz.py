"""Fuzzing: schemathesis generates requests for every route of a real server's /openapi.json.

The server is the real one (uvicorn in a thread, the engine thread, the default model in
bfloat16) with a small context and pool of its own, so prompts stay cheap; generated bodies
have max_tokens capped at MAX_NEW (and set to it where absent or null) so no case decodes long.
Half the positive cases drop the fields the server takes only at their neutral value
(NEUTRAL_ONLY), so they reach the engine instead of ending as a 400.

Checks, valid and invalid bodies alike: no 5xx (one client and a pool of every lane's whole
context: even a 503 would be a bug), and responses as the schema declares them (status
codes, content types, bodies, headers); invalid bodies must be refused (4xx). After the
run the server is healthy, answers a normal chat, and every chunk is free or parked.

Bounded: FUZZ_EXAMPLES cases per route at most (hypothesis stops earlier on small
schemas); STRATA_FUZZ_EXAMPLES overrides it for a longer local run.
"""

from __future__ import annotations

import collections
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import require  # noqa: E402

schemathesis = require("schemathesis")  # fails under CI=true when missing, skips elsewhere
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from serving import RunningServer, engine_loader, start_server  # noqa: E402

from strata.server.app import create_app  # noqa: E402
from strata.server.settings import ServerSettings  # noqa: E402

FUZZ_ENGINE = {
    "dtype": "bfloat16",
    "max_context": 128,
    "batch": 1,
    "kv_pool_tokens": 256,  # every lane's whole context: a refusal would be a bug here
    "kv_chunk": 16,
}
MAX_NEW = 4
FUZZ_EXAMPLES = int(os.environ.get("STRATA_FUZZ_EXAMPLES", "100"))

pytestmark = pytest.mark.fuzz


@pytest.fixture(scope="module")
def fuzz_server(gguf_path) -> RunningServer:
    settings_ = ServerSettings(model_alias="smol", sse_keepalive_s=5.0, max_body_bytes=64 * 1024)
    running = start_server(settings_, engine_loader(gguf_path, **FUZZ_ENGINE))
    yield running
    running.stop()


def cases() -> list:
    """Every operation the app declares, as schemathesis labels it ("POST /v1/completions"),
    with valid data, and with invalid data where it takes a body or parameters to spoil.
    Read from the app's own schema at collection time (no model is loaded for it); the
    tests fuzz the same operations through the running server's /openapi.json."""
    app = create_app(ServerSettings(), lambda: None, "smol")
    out = []
    for path, item in app.openapi()["paths"].items():
        for method, operation in item.items():
            label = f"{method.upper()} {path}"
            out.append(pytest.param(label, GenerationMode.POSITIVE, id=f"{label}-positive"))
            if operation.get("requestBody") or operation.get("parameters"):
                out.append(pytest.param(label, GenerationMode.NEGATIVE, id=f"{label}-negative"))
    return out


# Fields the schema types loosely (free-form objects, grammars, ranges it does not state): one of
# them in a generated body almost always makes it a 400, so half the positive cases go without
# them and reach the engine (the other half check that each is refused cleanly, never a 5xx).
NEUTRAL_ONLY = ("n", "best_of", "frequency_penalty", "presence_penalty", "logit_bias", "tools",
                "tool_choice", "response_format", "store", "echo", "suffix", "stream_options",
                "thinking", "repetition_penalty", "repeat_penalty", "repeat_last_n", "min_tokens",
                "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                "json_schema", "grammar", "chat_template_kwargs", "text", "reasoning", "include",
                "background", "top_logprobs", "previous_response_id", "truncation")


def cap(case, tame: bool) -> None:
    """max_tokens / max_completion_tokens at most MAX_NEW (set to it where both are absent or null);
    `tame`: drop the NEUTRAL_ONLY fields, and on the Messages API name the served model (it
    requires `model`, and a generated name is a 404)."""
    body = case.body
    if isinstance(body, dict) and case.operation.path == "/v1/responses":
        if tame:
            for key in NEUTRAL_ONLY:
                body.pop(key, None)
        value = body.get("max_output_tokens")
        # Absent, null or too many: MAX_NEW. Any other value stays as generated, so a negative
        # case whose only spoiled field this is (a string, say) is still refused, not repaired.
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > MAX_NEW):
            body["max_output_tokens"] = MAX_NEW
        return
    if isinstance(body, dict) and ("messages" in body or "prompt" in body):
        if tame:
            for key in NEUTRAL_ONLY:
                body.pop(key, None)
            if case.operation.path.startswith("/v1/messages"):
                body["model"] = "smol"
        if case.operation.path.endswith("/count_tokens") or not case.operation.path.startswith("/v1/"):
            return  # no max_tokens there (count_tokens, /tokenize, /apply-template)
        for key in ("max_tokens", "max_completion_tokens"):
            value = body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_NEW:
                body[key] = MAX_NEW
        # Absent or null: "until end-of-sequence or the context is full", up to 128 tokens:
        # a minute or more on 2 busy cores.
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = MAX_NEW


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return schemathesis.openapi.from_url(f"{fuzz_server.base_url}/openapi.json")


# schemathesis's own pytest integration (schema.parametrize, from_fixture) does not run
# under pytest 9 (it sets Function._nodeid), so each route is one test that drives
# hypothesis itself with the operation's strategy.
@pytest.mark.parametrize("label, mode", cases())
def test_route(api_schema, fuzz_server, label, mode):
    operation = api_schema.find_operation_by_label(label)
    assert operation is not None, f"/openapi.json lacks {label}"
    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_headers_conformance, response_schema_conformance]
    if mode is GenerationMode.NEGATIVE:
        assert operation.body or list(operation.iter_parameters()), f"{label}: nothing to make invalid"
        checks.append(negative_data_rejection)
    seen: list[int] = []

    @given(case=operation.as_strategy(generation_mode=mode), tame=st.booleans())
    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case, tame):
        cap(case, tame and mode is GenerationMode.POSITIVE)
        response = case.call(base_url=fuzz_server.base_url, timeout=120)
        seen.append(response.status_code)
        case.validate_response(response, checks=checks)

    run()
    assert seen, "no case was generated"
    print(f"{label} {mode}: {len(seen)} cases, statuses {sorted(collections.Counter(seen).items())}")


def test_healthy_after_fuzzing(fuzz_server):
    """Runs after the fuzzing (file order): the server still serves, nothing leaked."""
    with fuzz_server.client() as c:
        assert c.get("/health").status_code == 200
        r = c.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    deadline = time.monotonic() + 60
    while True:
        m = fuzz_server.metrics()
        held, parked = m['strata_kv_chunks{state="held"}'], m['strata_kv_chunks{state="parked"}']
        if m["strata_requests_running"] == 0 and held == parked:
            break
        assert time.monotonic() < deadline, f"chunks not free or parked: {m}"
        time.sleep(0.1)
    assert m['strata_kv_chunks{state="active"}'] == 0
    # 5xx by route; /health is 503 while the model loads (start_server polls it then).
    errors = {k: v for k, v in m.items() if k.startswith("strata_http_requests_total") and 'status="5' in k
              and k != 'strata_http_requests_total{route="/health",status="503"}'}
    assert not errors, errors

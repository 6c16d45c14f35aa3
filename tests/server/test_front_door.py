"""The front door: Host and Origin checks, CORS, the connection limit, the API key's forms,
queue capacity before tokenizing, stop string length, and 500s without exception text.

One real server for the module: 2 lanes and no waiting room (two held streams fill it),
at most 3 requests in flight, an API key, one allowed web origin and one extra host name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from serving import API_KEY, RunningServer, engine_loader, start_server

from strata.cli import build_parser
from strata.errors import ConfigError
from strata.server.cli import server_settings
from strata.server.settings import ServerSettings

FRONT_ENGINE = {
    "dtype": "bfloat16",
    "max_context": 512,
    "batch": 1,  # 2 lanes
    "kv_pool_tokens": 1024,
    "kv_chunk": 16,
}
ALLOWED = "https://app.example"
EXTRA_HOST = "strata.test"
MAX_CONNECTIONS = 3
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0}
LONG_STREAM = {
    "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
    "max_tokens": 400,
    "ignore_eos": True,
    "temperature": 0,
    "stream": True,
}


@pytest.fixture(scope="module")
def front(gguf_path) -> Iterator[RunningServer]:
    settings = ServerSettings(
        api_key=API_KEY,
        model_alias="smol",
        sse_keepalive_s=0.0,
        max_waiting=0,
        max_connections=MAX_CONNECTIONS,
        allow_origins=(ALLOWED,),
        allow_hosts=(EXTRA_HOST,),
    )
    running = start_server(settings, engine_loader(gguf_path, **FRONT_ENGINE))
    yield running
    running.stop()


def state_of(server: RunningServer):
    return server.server.config.app.state.strata


def port_of(server: RunningServer) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


def error_of(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["message"] and error["type"], error
    return error


@contextlib.contextmanager
def held_stream(server: RunningServer) -> Iterator[None]:
    """A streaming chat that holds a lane (and a connection) until the block ends."""
    with server.client() as c, c.stream("POST", "/v1/chat/completions", json=LONG_STREAM) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # kept: a dropped iterator closes the connection
        next(lines)  # the stream has started: the request is in the engine
        yield


@contextlib.contextmanager
def stalled_body(server: RunningServer) -> Iterator[socket.socket]:
    """A POST whose body never finishes arriving: in flight, buffered by the body limit."""
    sock = socket.create_connection(("127.0.0.1", port_of(server)))
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port_of(server)}\r\n"
        f"Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n{"
    )
    sock.sendall(head.encode())
    try:
        yield sock
    finally:
        sock.close()


def eventually(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


# ---- Origin and CORS ----------------------------------------------------------------------


def test_cross_site_origin_is_refused_before_the_engine(front, monkeypatch):
    loop = state_of(front).loop
    submitted = []

    def submit(*args):
        submitted.append(args)
        raise RuntimeError("a refused request reached the engine loop")

    monkeypatch.setattr(loop, "submit", submit)
    with front.client() as c:
        for origin in ("https://evil.example", "null", f"http://localhost:{port_of(front) + 1}"):
            r = c.post("/v1/chat/completions", json=CHAT, headers={"Origin": origin})
            error_of(r, 403, "origin_not_allowed")
            assert "access-control-allow-origin" not in r.headers
        # The no-cors form POST a web page can send without a preflight.
        r = c.post(
            "/v1/completions",
            content=json.dumps({"prompt": "hi"}).encode(),
            headers={"Origin": "https://evil.example", "Content-Type": "text/plain"},
        )
        error_of(r, 403, "origin_not_allowed")
        # Its preflight too.
        r = c.options(
            "/v1/chat/completions",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        error_of(r, 403, "origin_not_allowed")
    assert submitted == []
    refused = 'strata_http_requests_total{route="/v1/chat/completions",status="403"}'
    assert front.metrics()[refused] >= 3  # counted, as every answer is


def test_allowed_and_same_origin_pass_with_cors_for_the_allowed(front):
    with front.client() as c:
        r = c.options(
            "/v1/chat/completions",
            headers={
                "Origin": ALLOWED,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os",
            },
        )
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == ALLOWED
        assert "POST" in r.headers["access-control-allow-methods"]
        r = c.post("/v1/chat/completions", json=CHAT, headers={"Origin": ALLOWED})
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == ALLOWED
        # The page can read a refusal too (the key is checked after CORS).
        r = c.get("/v1/models", headers={"Origin": ALLOWED, "Authorization": "Bearer wrong"})
        error_of(r, 401, "invalid_api_key")
        assert r.headers["access-control-allow-origin"] == ALLOWED
        # A page this server serves itself (e.g. /docs) is same-origin: allowed, no CORS.
        r = c.post("/v1/chat/completions", json=CHAT, headers={"Origin": front.base_url})
        assert r.status_code == 200, r.text
        assert "access-control-allow-origin" not in r.headers


def test_a_form_body_is_json_only_without_an_origin(front):
    body = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    with front.client() as c:
        for declared in ("application/x-www-form-urlencoded", "text/plain", None):
            headers = {"Origin": ALLOWED, **({"Content-Type": declared} if declared else {})}
            r = c.post("/v1/completions", content=body, headers=headers)
            error_of(r, 415, "unsupported_media_type")
        assert c.post("/v1/completions", content=body, headers=form).status_code == 200  # curl -d


# ---- Host -----------------------------------------------------------------------------------


def test_host_must_name_this_server(front):
    port = port_of(front)
    with front.client() as c:
        for host in ("evil.example", f"evil.example:{port}", f"localhost.evil.example:{port}"):
            error_of(c.get("/v1/models", headers={"Host": host}), 400, "invalid_host")
        error_of(c.get("/health", headers={"Host": "evil.example"}), 400, "invalid_host")
        for host in (
            f"localhost:{port}",
            f"127.0.0.1:{port}",
            "127.0.0.1",
            f"[::1]:{port}",
            f"LOCALHOST:{port}",
            EXTRA_HOST,
        ):
            r = c.get("/v1/models", headers={"Host": host})
            assert r.status_code == 200, (host, r.text)


# ---- the API key ----------------------------------------------------------------------------


def test_bearer_scheme_in_any_case(front):
    for value, status in [
        (f"bearer {API_KEY}", 200),
        (f"BEARER {API_KEY}", 200),
        (f"Bearer  {API_KEY}", 200),
        (f"Basic {API_KEY}", 401),
        (f"Bearer{API_KEY}", 401),
        ("bearer wrong", 401),
        (f"Bearer {API_KEY}x", 401),
    ]:
        with front.client(headers={"Authorization": value}) as c:
            assert c.get("/v1/models").status_code == status, value


def test_api_key_from_the_environment_the_flag_wins(monkeypatch):
    parse = build_parser().parse_args
    assert server_settings(parse(["serve"]), {"STRATA_API_KEY": "env-key"}).api_key == "env-key"
    assert server_settings(parse(["serve"]), {}).api_key is None
    flagged = parse(["serve", "--api-key", "flag-key"])
    assert server_settings(flagged, {"STRATA_API_KEY": "env-key"}).api_key == "flag-key"
    with pytest.raises(ConfigError, match="STRATA_API_KEY"):
        server_settings(parse(["serve"]), {"STRATA_API_KEY": " "})
    # cmd_serve reads the real environment.
    monkeypatch.setenv("STRATA_API_KEY", "from-env")
    assert server_settings(parse(["serve"]), os.environ).api_key == "from-env"
    args = parse(["serve", "--allow-origin", "https://a.example,http://b.example:81/",
                  "--allow-origin", "*", "--allow-host", "x.test", "--max-connections", "7"])
    settings = server_settings(args, {})
    assert settings.allow_origins == ("https://a.example", "http://b.example:81", "*")
    assert (settings.allow_hosts, settings.max_connections) == (("x.test",), 7)
    with pytest.raises(ConfigError, match="--allow-origin"):
        server_settings(parse(["serve", "--allow-origin", "https://a.example/path"]), {})
    with pytest.raises(ConfigError, match="--max-connections"):
        server_settings(parse(["serve", "--max-connections", "0"]), {})


# ---- capacity: connections, then the queue before tokenizing --------------------------------


def test_connection_limit_is_a_503_in_the_error_shape(front):
    def models() -> httpx.Response:  # a fresh connection each time
        return httpx.get(f"{front.base_url}/v1/models", headers=front.headers)

    with held_stream(front), held_stream(front):
        with stalled_body(front):
            # 2 streams + 1 body on its way = 3 in flight: the streams count while they run.
            r = eventually(lambda: (r := models()).status_code == 503 and r)
            error = error_of(r, 503, "too_many_connections")
            assert error["type"] == "unavailable_error" and error["retry_after"] >= 1
            assert int(r.headers["Retry-After"]) >= 1
            assert str(MAX_CONNECTIONS) in error["message"]
            assert httpx.get(f"{front.base_url}/health").status_code == 200  # not counted
        # The stalled body gave its place back.
        eventually(lambda: models().status_code == 200)
    # Both streams ended: a generation gets in again.
    with front.client() as c:
        eventually(lambda: c.post("/v1/chat/completions", json=CHAT).status_code == 200)


def test_queue_full_is_decided_before_tokenizing(front, monkeypatch):
    tokenizer = state_of(front).loop.info.tokenizer
    calls = []
    for name in ("encode", "encode_chat", "render_chat"):
        original = getattr(tokenizer, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(tokenizer, name, spy)
    with held_stream(front), held_stream(front), front.client() as c:
        calls.clear()
        error_of(c.post("/v1/chat/completions", json=CHAT), 503, "queue_full")
        error_of(c.post("/v1/completions", json={"prompt": "Hi there"}), 503, "queue_full")
        assert calls == []  # refused without rendering the template or tokenizing
    with front.client() as c:  # and the spy does see a request that is taken
        eventually(lambda: c.post("/v1/chat/completions", json=CHAT).status_code == 200)
    assert {"encode_chat", "render_chat"} & set(calls), calls  # the chat template was rendered


# ---- stop strings and 500s ------------------------------------------------------------------


def test_an_over_long_stop_string_is_a_400_naming_stop(front):
    with front.client() as c:
        r = c.post("/v1/chat/completions", json={**CHAT, "stop": ["ok", "x" * 257]})
        assert error_of(r, 400, "invalid_request_error")["param"] == "stop"
        r = c.post("/v1/completions", json={"prompt": "Hi", "stop": "y" * 1000})
        assert error_of(r, 400, "invalid_request_error")["param"] == "stop"
        r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "stop": "z" * 256})
        assert r.status_code == 200, r.text


def test_a_failure_inside_a_route_is_a_500_with_an_incident_id(front, monkeypatch, caplog):
    from strata.server.errors import ServerError

    state = state_of(front)

    def broken_render():
        raise RuntimeError("secret detail: /etc/strata/private.key")

    def broken_ready():
        raise ServerError("the engine failed: secret tensor shape [3, 7]")

    monkeypatch.setattr(state.metrics, "render", broken_render)
    monkeypatch.setattr(state.loop, "check_ready", broken_ready)
    with caplog.at_level(logging.ERROR, logger="strata.server"), front.client() as c:
        responses = [c.get("/metrics"), c.post("/v1/chat/completions", json=CHAT)]
    for r, secret in zip(responses, ("private.key", "tensor shape"), strict=True):
        error = error_of(r, 500, "internal_error")
        assert secret not in r.text and "secret" not in r.text, r.text
        assert error["type"] == "server_error"
        assert re.fullmatch(r"err-[0-9a-f]{12}", error["id"]), error
        assert error["id"] in error["message"], error
        logged = [rec.getMessage() for rec in caplog.records if error["id"] in rec.getMessage()]
        assert logged and secret in logged[0], caplog.text

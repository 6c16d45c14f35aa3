"""A step that fails over HTTP: the request it carried ends with a 500 `server_error` (or an
SSE error event once streaming), a short message with an error id and no exception text;
its chunks go back, and the server answers the next request as usual."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
from serving import POOL_ENGINE, RunningServer, engine_loader, sse_events, start_server

from strata.server.settings import ServerSettings


@pytest.fixture(scope="module")
def faulty_server(gguf_path) -> Iterator[tuple[RunningServer, threading.Event]]:
    fault = threading.Event()
    load = engine_loader(gguf_path, **POOL_ENGINE)

    def load_faulty():
        engine = load()
        forward = engine._runner.model.forward

        def faulty(*args, **kwargs):
            if fault.is_set():
                fault.clear()  # one step fails, the next ones run
                raise RuntimeError("injected fault: secret detail")
            return forward(*args, **kwargs)

        engine._runner.model.forward = faulty
        return engine

    running = start_server(ServerSettings(model_alias="smol", sse_keepalive_s=0.0), load_faulty)
    yield running, fault
    running.stop()


def chat(max_tokens: int, stream: bool = False) -> dict:
    return {
        "model": "smol",
        "messages": [{"role": "user", "content": "Name three rivers."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


def no_request_holds_chunks(m: dict[str, float]) -> bool:
    return m["strata_requests_running"] == 0 and m['strata_kv_chunks{state="active"}'] == 0


def test_a_failed_step_is_a_500_with_an_id_and_the_server_carries_on(faulty_server):
    server, fault = faulty_server
    before = server.metrics().get("strata_failed_steps_total", 0.0)
    with server.client() as c:
        fault.set()
        r = c.post("/v1/chat/completions", json=chat(8))
        assert r.status_code == 500, r.text
        error = r.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "server_error"
        assert "error id err-" in error["message"] and "secret" not in r.text
        m = server.wait_until(no_request_holds_chunks)
        assert m["strata_failed_steps_total"] == before + 1
        r = c.post("/v1/chat/completions", json=chat(4))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_a_failed_step_mid_stream_is_an_error_event_then_done(faulty_server):
    server, fault = faulty_server
    with server.client() as c:
        with c.stream("POST", "/v1/chat/completions", json=chat(64, stream=True)) as r:
            assert r.status_code == 200
            events = sse_events(r)
            first = json.loads(next(events))
            assert first["choices"][0]["delta"] is not None
            fault.set()
            rest = list(events)
        assert rest[-1] == "[DONE]"
        errors = [json.loads(e)["error"] for e in rest[:-1] if "error" in json.loads(e)]
        assert len(errors) == 1 and errors[0]["type"] == "server_error"
        assert "secret" not in json.dumps(rest)
        server.wait_until(no_request_holds_chunks)
        r = c.post("/v1/chat/completions", json=chat(4))
        assert r.status_code == 200

"""/health while the model loads, and after loading fails; the `serve` command line."""

from __future__ import annotations

import threading
import time

import httpx
from serving import start_server

from strata.cli import build_parser
from strata.errors import LoaderError
from strata.server.settings import ServerSettings


def test_health_is_503_while_loading_then_reports_a_failed_load():
    release = threading.Event()

    def slow_failing_load():
        release.wait(60)
        raise LoaderError("no such model file: /nowhere.gguf")

    server = start_server(ServerSettings(), slow_failing_load, wait_ready=False)
    try:
        r = httpx.get(f"{server.base_url}/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        assert r.headers["Retry-After"] == "1"
        r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        assert httpx.get(f"{server.base_url}/metrics").status_code == 200
        release.set()
        deadline = time.monotonic() + 30
        while (body := httpx.get(f"{server.base_url}/health").json())["error"][
            "code"
        ] == "model_loading":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert (
            body["error"]["code"] == "model_load_failed"
            and "/nowhere.gguf" in body["error"]["message"]
        )
    finally:
        release.set()
        server.stop()


def test_serve_command_line_defaults():
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.batch, args.api_key) == ("127.0.0.1", 8080, 3, None)
    args = build_parser().parse_args(
        ["serve", "--port", "9000", "--api-key", "k", "--max-waiting", "4", "--max-context", "512"]
    )
    assert (args.port, args.api_key, args.max_waiting, args.max_context) == (9000, "k", 4, 512)

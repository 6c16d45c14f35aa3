"""Helpers for the server tests: a real uvicorn server on a free loopback port, in a thread."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import uvicorn

from strata.config import EngineConfig
from strata.server.app import create_app
from strata.server.listener import uvicorn_config
from strata.server.settings import ServerSettings
from step_gate import StepGate

API_KEY = "test-key"
MAIN_ENGINE = {
    "dtype": "float32",
    "max_context": 1024,
    "batch": 3,
    "kv_pool_tokens": 4096,
    "kv_chunk": 64,
}
POOL_ENGINE = {
    "dtype": "bfloat16",
    "max_context": 256,
    "batch": 1,
    "kv_pool_tokens": 256,
    "kv_chunk": 16,
    "spec": "off",  # its tests follow the pool cell by cell: one token a step (drafts are tested apart)
}
READY_TIMEOUT_S = 300.0
# STRATA_TEST_KV=int8 (or f16, ...) runs the shared servers on that K/V dtype: the server suite's
# K/V tests then check it (e.g. `STRATA_TEST_KV=int8 pytest tests/server/test_pool_http.py`).
if os.environ.get("STRATA_TEST_KV"):
    MAIN_ENGINE["kv"] = POOL_ENGINE["kv"] = os.environ["STRATA_TEST_KV"]


@dataclass
class RunningServer:
    base_url: str
    server: uvicorn.Server
    thread: threading.Thread
    api_key: str | None = None
    gate: StepGate | None = None  # the engine's step hook, when its loader has one (step_gate.py)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, headers: dict[str, str] | None = None) -> httpx.Client:
        """An httpx client with the server's API key (or the given headers instead)."""
        return httpx.Client(
            base_url=self.base_url,
            headers=self.headers if headers is None else headers,
            timeout=120.0,
        )

    def openai(self, **kwargs):
        import openai

        return openai.OpenAI(
            base_url=f"{self.base_url}/v1", **{"api_key": self.api_key or "none", "timeout": 120.0, **kwargs}
        )

    def anthropic(self, **kwargs):
        """The real `anthropic` client on this server (the key as `x-api-key`)."""
        import anthropic

        kwargs = {"api_key": self.api_key or "none", "timeout": 120.0, **kwargs}
        return anthropic.Anthropic(base_url=self.base_url, **kwargs)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, keyed by its name plus labels as printed."""
        with self.client() as c:
            text = c.get("/metrics").text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples

    def wait_until(
        self, check: Callable[[dict[str, float]], bool], timeout: float = 60.0
    ) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if check(m):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"/metrics never satisfied the check; last: {pool_view(m)}")
            time.sleep(0.05)

    def wait_submitted(self, n: int, timeout: float = 60.0) -> None:
        """Until the HTTP side has submitted `n` requests to the engine loop that have not ended
        (the loop's own count, which its queue check reads: a test may look in)."""
        loop = self.server.config.app.state.strata.loop
        deadline = time.monotonic() + timeout
        while loop._num_active < n:
            assert time.monotonic() < deadline, f"{loop._num_active} of {n} requests submitted"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def pool_view(m: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in m.items() if re.match(r"strata_(kv|requests_(running|queued))", k)}


def start_server(
    settings: ServerSettings, load_engine, model_id: str = "smol", wait_ready: bool = True,
    fd_limit: int | None = None,
) -> RunningServer:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(settings, load_engine, model_id)
    server = uvicorn.Server(uvicorn_config(app, settings, timeout_graceful_shutdown=2, fd_limit=fd_limit))  # as `strata serve`
    app.state.strata_stopping = lambda: server.should_exit  # as `strata serve` does
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True
    )
    thread.start()
    running = RunningServer(f"http://127.0.0.1:{port}", server, thread, settings.api_key,
                            getattr(load_engine, "gate", None))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    while wait_ready:
        if httpx.get(f"{running.base_url}/health", timeout=10).status_code == 200:
            break
        assert time.monotonic() < deadline, "the model did not load in time"
        time.sleep(0.1)
    return running


def engine_loader(gguf_path: str, gate: StepGate | None = None, **options) -> Callable:
    """Loads the engine (with `gate`, its steps pass through that step hook: `load.gate`)."""
    def load():
        from strata.engine.engine import Engine

        engine = Engine(EngineConfig(model=gguf_path, **options), progress=False)
        return gate.wrap(engine) if gate is not None else engine

    load.gate = gate
    return load


def sse_events(response: httpx.Response) -> Iterator[str]:
    """The `data:` payloads of an SSE response, as they arrive."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: ") :]

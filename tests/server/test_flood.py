"""A connection flood against the server `strata serve` runs (tests/server/serving.py uses its
uvicorn configuration): far more concurrent streams than --max-connections, on the OpenAI and
Anthropic routes at once. Every answer is a 200 stream or the documented refusal (503 in
OpenAI's shape on /v1/chat/completions, 529 in Anthropic's on /v1/messages, with Retry-After),
some are served, /health and /metrics answer during the flood, and the server is healthy and
holds no request after it; the flood comes after a save the storage refused. Past the
listener's cap on open connections, a connection is dropped.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import threading
import time
from collections import Counter

import httpx
import pytest
from serving import engine_loader, start_server

from strata.server.listener import FD_RESERVE, open_connection_cap
from strata.server.settings import ServerSettings

ENGINE = {"dtype": "bfloat16", "max_context": 256, "batch": 1, "kv_pool_tokens": 512, "kv_chunk": 16, "spec": "off"}
MAX_CONNECTIONS = 4
FLOOD = 96  # 24 x --max-connections
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0, "stream": True}
MESSAGES = {"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "Say hi."}], "stream": True}


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("flood-slots"))


@pytest.fixture(scope="module")
def flood_server(gguf_path, slot_dir):
    settings = ServerSettings(model_alias="smol", max_connections=MAX_CONNECTIONS, max_waiting=1, sse_keepalive_s=0.0,
                              slot_save_path=slot_dir)
    running = start_server(settings, engine_loader(gguf_path, **ENGINE))
    yield running
    running.stop()


async def _one(client: httpx.AsyncClient, i: int) -> tuple[str, int, str, str | None, str]:
    route, body = ("/v1/messages", MESSAGES) if i % 2 else ("/v1/chat/completions", CHAT)
    async with client.stream("POST", route, json=body) as r:
        data = (await r.aread()).decode()
        return route, r.status_code, r.headers.get("content-type", ""), r.headers.get("retry-after"), data


async def _flood(base_url: str) -> tuple[list, list[int]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)  # one connection each
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:
        tasks = [asyncio.create_task(_one(client, i)) for i in range(FLOOD)]
        probes = []
        while not all(t.done() for t in tasks):  # the uncounted routes answer during the flood
            probes.append((await client.get("/health")).status_code)
            probes.append((await client.get("/metrics")).status_code)
            await asyncio.sleep(0.2)
        return [t.result() for t in tasks], probes


def failed_save(base_url: str, slot_dir: str) -> None:
    """A save the storage refuses (its directory removed under the server): a named 409, and
    the flood after it is answered as one on a fresh server (once, such a run refused all)."""
    assert httpx.post(f"{base_url}/v1/chat/completions", json={**CHAT, "stream": False}, timeout=120).status_code == 200
    shutil.rmtree(slot_dir)
    try:
        r = httpx.post(f"{base_url}/slots/0", params={"action": "save"}, json={"filename": "chat.bin"}, timeout=120)
        assert r.status_code == 409 and r.json()["error"]["code"] == "directory_missing", r.text
    finally:
        os.makedirs(slot_dir)


def test_a_flood_is_answered_in_the_api_shape(flood_server, slot_dir):
    failed_save(flood_server.base_url, slot_dir)
    results, probes = asyncio.run(_flood(flood_server.base_url))
    outcomes = Counter()
    for route, status, ctype, retry_after, data in results:
        if status == 200:
            assert ctype.startswith("text/event-stream"), (route, data[:200])
            outcomes["served"] += 1
            continue
        assert ctype.startswith("application/json"), (route, status, ctype, data[:200])
        assert retry_after is not None and int(retry_after) >= 1, (route, status, data[:200])
        body = json.loads(data)
        if route == "/v1/messages":
            assert status == 529 and body["error"]["type"] == "overloaded_error", body
        else:
            assert status == 503 and body["error"]["type"] == "unavailable_error", body
            assert body["error"]["code"] in ("too_many_connections", "queue_full"), body
        outcomes[status] += 1
    assert outcomes["served"] >= 1 and sum(outcomes.values()) == FLOOD, outcomes
    assert probes and set(probes) == {200}, probes
    assert httpx.get(f"{flood_server.base_url}/health").status_code == 200
    state = flood_server.server.config.app.state.strata
    deadline = time.monotonic() + 30
    while state.loop.snapshot.num_running or state.loop.snapshot.num_queued:
        assert time.monotonic() < deadline, "requests still held after the flood"
        time.sleep(0.05)
    r = httpx.post(f"{flood_server.base_url}/v1/chat/completions", json={**CHAT, "stream": False}, timeout=120)
    assert r.status_code == 200, r.text


def test_past_the_open_connection_cap_a_connection_is_dropped():
    """A server whose descriptor budget allows 6 open connections: a 7th is closed unanswered,
    and once one closes a new one is answered again (here /health while the model loads)."""
    cap = open_connection_cap(2, FD_RESERVE + 6)
    assert cap == 6 and open_connection_cap(128, 1 << 20) == 4096 and open_connection_cap(4, 1 << 20) == 1024
    never = threading.Event()

    def load():
        never.wait()
        raise RuntimeError("this test's model never loads")

    settings = ServerSettings(max_connections=2)
    running = start_server(settings, load, wait_ready=False, fd_limit=FD_RESERVE + 6)
    port = int(running.base_url.rsplit(":", 1)[1])
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(cap)]
    try:
        extra = socket.create_connection(("127.0.0.1", port))
        extra.settimeout(10)
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            assert extra.recv(100) == b""  # closed without an answer
        except ConnectionResetError:
            pass
        extra.close()
        held.pop().close()
        connections = running.server.server_state.connections  # what the cap counts (listener.py)
        deadline = time.monotonic() + 30
        while len(connections) >= cap:  # until the server has seen that connection close
            assert time.monotonic() < deadline, f"{len(connections)} connections still open"
            time.sleep(0.01)
        assert httpx.get(f"{running.base_url}/health", timeout=10).status_code == 503  # loading, answered
    finally:
        for s in held:
            s.close()
        never.set()
        running.stop()

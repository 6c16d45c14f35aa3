"""The browser app's routes over HTTP on the shared `main_server` (an API key, loopback):
the page and its files are open but guarded by Host and Origin and a strict CSP; the
monitor feed needs the key, follows the pool, and lets go of the engine when it closes."""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
from serving import API_KEY, RunningServer, engine_loader, sse_events, start_server

from strata.server.settings import ServerSettings


def feed_frames(server: RunningServer, headers: dict[str, str] | None = None):
    """Yields the feed's frames (dicts) while the caller reads; closes the stream after."""
    with httpx.Client(base_url=server.base_url, headers=headers or server.headers, timeout=60) as c:
        with c.stream("GET", "/monitor/feed") as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            for event in sse_events(r):
                yield json.loads(event)


def watchers(server: RunningServer) -> int:
    return server.server.config.app.state.strata.loop.pool_watch.watchers


def test_the_page_and_its_files_are_open_with_a_strict_csp(main_server):
    with httpx.Client(base_url=main_server.base_url) as c:  # no key
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe" not in csp
        assert '<script type="module" src="/ui/app.js">' in page.text
        for name, kind in [("app.js", "text/javascript"), ("markdown.js", "text/javascript"), ("app.css", "text/css")]:
            r = c.get(f"/ui/{name}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind), name
            assert r.headers["x-content-type-options"] == "nosniff"
        for name in ["missing.js", "index.html", "..%2fapp.py", "routes.py"]:
            assert c.get(f"/ui/{name}").status_code == 404, name
        assert c.get("/monitor/feed").status_code == 401  # the feed is the API: it needs the key
        assert c.get("/v1/models").status_code == 401


def test_host_and_origin_rules_hold_for_the_app(main_server):
    port = main_server.base_url.rsplit(":", 1)[1]
    with httpx.Client(base_url=main_server.base_url, headers=main_server.headers) as c:
        assert c.get("/", headers={"Host": "evil.example"}).json()["error"]["code"] == "invalid_host"
        foreign = c.get("/ui/app.js", headers={"Origin": "https://evil.example"})
        assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "origin_not_allowed"
        assert c.get("/monitor/feed", headers={"Origin": "https://evil.example"}).status_code == 403
        own = {"Origin": f"http://127.0.0.1:{port}", "Authorization": f"Bearer {API_KEY}"}
        with c.stream("GET", "/monitor/feed", headers=own) as r:
            assert r.status_code == 200


def test_the_feed_shows_a_conversation_and_releases_the_engine_when_closed(main_server):
    with main_server.client() as c:
        r = c.post("/v1/completions", json={"prompt": list(range(7000, 7130)), "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200
    frames = feed_frames(main_server)
    first = next(frames)
    assert first["state"] == "ready" and first["model"] == "smol"
    while "picture" not in first:  # the engine thread answers the feed's wake-up
        first = next(frames)
    assert watchers(main_server) == 1
    picture = first["picture"]
    assert picture["num_chunks"] == 4096 // 64 and len(picture["lanes"]) == 4 and picture["pooled"]
    assert picture["groups"] == [] and picture["full_layers"] == []  # no windows: one group, drawn as before
    # 130 prompt ids hold K/V; the one token sampled was never fed back.
    ours = [p for p in picture["parked"] if p["num_cells"] == 130 and p["num_chunks"] == 3]
    assert ours, picture["parked"]
    conv_id = ours[-1]["conv_id"]
    held = [i for i, owner in enumerate(picture["chunk_owner"]) if owner == conv_id]
    assert [picture["chunk_filled"][i] for i in held] == [64, 64, 2]  # chunks of 64 cells
    assert len(picture["chunk_state"]) == picture["num_chunks"]
    samples = next(f for f in frames if "samples" in f)["samples"]
    assert {"tokens_per_s", "cpu_percent", "rss_mib", "num_queued"} <= set(samples[-1])
    frames.close()
    deadline = time.monotonic() + 30
    while watchers(main_server) != 0:  # the stream's close runs on the server's loop
        assert time.monotonic() < deadline, "the feed never let go of the pool watch"
        time.sleep(0.05)


def test_the_app_and_feed_stay_out_of_the_openapi_schema(main_server):
    with main_server.client() as c:
        paths = c.get("/openapi.json").json()["paths"]
    assert "/monitor/feed" not in paths and "/" not in paths and not any(p.startswith("/ui/") for p in paths)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_an_open_feed_ends_when_the_server_shuts_down(tiny_llama_dir):
    """uvicorn waits for open responses before it stops: the feed must end by itself rather
    than be cancelled when the grace period runs out."""
    running = start_server(ServerSettings(), engine_loader(tiny_llama_dir, dtype="float32", max_context=128))
    frames: list[str] = []
    outcome: list[str] = []

    def read() -> None:
        try:
            with httpx.stream("GET", running.base_url + "/monitor/feed", timeout=60) as r:
                for event in sse_events(r):
                    frames.append(event)
            outcome.append("ended")
        except httpx.HTTPError as exc:
            outcome.append(f"broken: {exc!r}")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while not frames:
        assert time.monotonic() < deadline, "no frame arrived"
        time.sleep(0.05)
    records = Records()
    logging.getLogger("uvicorn.error").addHandler(records)
    try:
        running.stop()
    finally:
        logging.getLogger("uvicorn.error").removeHandler(records)
    reader.join(30)
    assert outcome == ["ended"]
    assert not any("graceful shutdown" in m for m in records.messages), records.messages
    assert not running.thread.is_alive()

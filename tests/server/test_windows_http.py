"""Sliding-window layer groups over HTTP (docs/windows.md): a tiny random Gemma 3 (layers 0, 2, 3
read through a window of 8 cells, layer 1 fully), float32, in a pool of chunks of 4 cells. The
Monitor's feed draws one chunk map per layer group (and the page, in headless Chromium: see
browser.py, one row per group), and /slots, /metrics and the start line give each windowed
group's chunks: held, kept for kept windows, free, and its size.

One conversation of 30 prompt ids, then a follow-up to 50 cells: the windowed group holds the
window of its next token (50 reads 43..50: chunks 10, 11, 12 of the conversation) and the window
kept before its first prompt's end and its follow-up's start (29 and 30 read 22..29: chunks 5, 6,
7); chunks 0..4, 8 and 9 were given back as the window passed them.
"""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from browser import BrowserSession, artifacts_dir, problems
from serving import RunningServer, engine_loader, sse_events, start_server

from strata.config import EngineConfig
from strata.kv.groups import lane_window_chunks, window_bound
from strata.server.settings import ServerSettings
from tests.conftest import make_tiny_model, require

require("transformers")

WINDOW, CHUNK, PIECE, LANES = 8, 4, 8, 2
ENGINE = {"dtype": "float32", "max_context": 64, "batch": LANES - 1, "kv_pool_tokens": 128, "kv_chunk": CHUNK,
          "prefill_chunk": PIECE, "spec": "off"}
# build.py's sizing: every lane's window and step, then the windows of one idle conversation per
# lane and a branch's (its window and its fork's copy)
WINDOW_CHUNKS = LANES * lane_window_chunks(WINDOW, CHUNK, PIECE) + (LANES + 1) * window_bound(WINDOW, CHUNK) + 1
FIRST = list(range(300, 330))  # 30 prompt ids
FOLLOW = FIRST + list(range(600, 620))  # a follow-up to 50 cells


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory, smol_tokenizer) -> str:
    return make_tiny_model("gemma3_text", str(tmp_path_factory.mktemp("gemma3-w8")), smol_tokenizer,
                           sliding_window=WINDOW, head_dim=16, query_pre_attn_scalar=24, num_hidden_layers=4,
                           layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                        "sliding_attention"], tie_word_embeddings=True, rope_local_base_freq=500.0)


@pytest.fixture(scope="module")
def server(gemma3_dir):
    running = start_server(ServerSettings(), engine_loader(gemma3_dir, **ENGINE))
    with running.client() as c:
        for prompt in (FIRST, FOLLOW):
            body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
            assert c.post("/v1/completions", json=body).status_code == 200
    yield running
    running.stop()


def first_picture(server: RunningServer) -> dict:
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        with c.stream("GET", "/monitor/feed") as r:
            for event in sse_events(r):
                frame = json.loads(event)
                if "picture" in frame:
                    return frame["picture"]
    raise AssertionError("the feed ended without a picture")


def test_the_feed_draws_one_chunk_map_per_layer_group(server):
    p = first_picture(server)
    assert p["full_layers"] == [1] and p["chunk_size"] == CHUNK
    (g,) = p["groups"]
    assert (g["window"], g["layers"], g["num_chunks"]) == (WINDOW, [0, 2, 3], WINDOW_CHUNKS)
    assert g["bytes_per_cell"] == 3 * p["full_bytes_per_cell"] > 0  # three layers to the full group's one
    (conv,) = [c for c in p["parked"] if c["num_cells"] == 50]
    assert conv["num_chunks"] == 13 and conv["window_chunks"] == [6]
    ours = conv["conv_id"]
    full = [i for i, owner in enumerate(p["chunk_owner"]) if owner == ours]
    assert full == list(range(13))  # the full group keeps every cell
    assert [p["chunk_filled"][i] for i in full] == [4] * 12 + [2]
    # Each group's ids are its own (each new chunk taken after the table's last): the windowed
    # group's ids follow its positions, and those the window passed went back to its free list.
    held = [i for i, owner in enumerate(g["chunk_owner"]) if owner == ours]
    assert held == [5, 6, 7, 10, 11, 12] and g["num_chunks_free"] == WINDOW_CHUNKS - 6 == g["chunk_state"].count(0)
    assert [g["chunk_state"][i] for i in held] == [5, 5, 5, 2, 2, 2]  # KEPT (before 29, 30), PARKED (its window)
    assert g["num_chunks_kept"] == 3
    assert [g["chunk_filled"][i] for i in held] == [4, 4, 4, 4, 4, 2]  # chunk 12 holds 48, 49
    assert all(g["chunk_holders"][i] == 1 for i in held)


def test_slots_and_metrics_give_each_groups_chunks(server):
    with server.client() as c:
        slots = c.get("/slots").json()
    (slot,) = [s for s in slots if s["conversation_tokens"] == 50]
    assert slot["chunks_held"] == 13
    assert slot["window_groups"] == [{"window": WINDOW, "layers": 3, "chunks_held": 6, "chunks_kept": 3,
                                      "kept_windows": 3, "group_chunks_total": WINDOW_CHUNKS,
                                      "group_chunks_free": WINDOW_CHUNKS - 6}]  # kept: 29, 30 and 49
    m = server.metrics()
    label = f'window="{WINDOW}"'
    assert {s: m[f'strata_kv_window_chunks{{state="{s}",{label}}}'] for s in ("total", "held", "free", "kept")} \
        == {"total": WINDOW_CHUNKS, "held": 6, "free": WINDOW_CHUNKS - 6, "kept": 3}
    assert m[f"strata_kv_window_layers{{{label}}}"] == 3


def test_the_start_line_gives_each_groups_size(gemma3_dir, caplog):
    from strata.engine.engine import Engine

    with caplog.at_level(logging.INFO, logger="strata"):
        engine = Engine(EngineConfig(model=gemma3_dir, **ENGINE), progress=False)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("KV layer groups:"))
    full, window = (engine._kv.group_bytes_per_cell(g) * CHUNK / 1024 for g in (0, 1))
    assert line == (f"KV layer groups: full: 1 layer (1), 32 chunks, {32 * full:.1f} KiB; "
                    f"window {WINDOW}: 3 layers (0, 2-3), {WINDOW_CHUNKS} chunks, {WINDOW_CHUNKS * window:.1f} KiB")


def test_the_monitor_page_draws_a_row_per_group(server, tmp_path_factory):
    session = BrowserSession()
    try:
        page = session.new_page()
        page.goto(server.base_url + "/#monitor")
        row = "#window-groups .group-row[data-window='8']"
        page.wait_for_function(f"() => document.querySelectorAll(\"{row} .chunk\").length === {WINDOW_CHUNKS}")
        assert page.locator("#grid .chunk").count() == 32  # the full group's row, as without windows
        ours = page.locator("#parked li", has_text=" 50 cells").get_attribute("data-conv")
        states = page.eval_on_selector_all(f"{row} .chunk[data-conv='{ours}']",
                                           "cells => cells.map(c => [+c.dataset.chunk, c.dataset.state])")
        assert states == [[5, "kept"], [6, "kept"], [7, "kept"], [10, "parked"], [11, "parked"], [12, "parked"]]
        assert page.locator(f"#grid .chunk[data-conv='{ours}']").count() == 13
        kib = WINDOW_CHUNKS * CHUNK * 3 * 256 / 1024  # 2 K/V heads of 16 float32s, K and V: 256 bytes a layer
        assert page.locator(f"{row} .group-label").inner_text() == (
            f"window 8 · 3 layers (0, 2–3) · 6/{WINDOW_CHUNKS} chunks held (3 kept) · {kib:.1f} KiB")
        assert page.locator("#full-label").inner_text() == "full attention · 1 layer (1) · 13/32 chunks held · 32.0 KiB"
        assert " 50 cells · 13 · w8: 6 chunks" in page.locator(f"#parked li[data-conv='{ours}']").inner_text()
        assert page.locator("#legend-kept").is_visible()
        page.screenshot(path=str(artifacts_dir(tmp_path_factory) / "monitor-windows.png"))
        assert problems(page) == []
    finally:
        session.close()

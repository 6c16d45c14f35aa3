"""The resident ring in serve: each lane sizes its ring for the request it admits.

Adaptive sizing on, cap 256 cells, default ring 64, pages of 16: a request whose prompt +
max_tokens + one page reaches the cap gets 256 cells; a short one keeps 64. Both lanes'
sizes show in /slots and /metrics; a budget too small for a second cap-sized ring keeps
that lane at the default ring and counts it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serving import RunningServer, engine_loader, start_server
from step_gate import StepGate

from strata.server.settings import ServerSettings

RING = {"dtype": "bfloat16", "max_context": 512, "batch": 2, "kv_chunk": 64, "kv_pool_tokens": 2048,
        "kv_resident": 256, "kv_page": 16, "kv_ring_default": 64, "kv_ring_adapt": True,
        "kv_ring_budget": 256 + 2 * 64}


@pytest.fixture(scope="module")
def ring_server(gguf_path) -> Iterator[RunningServer]:
    running = start_server(ServerSettings(model_alias="smol"), engine_loader(gguf_path, gate=StepGate(), **RING))
    yield running
    running.stop()


def complete(server: RunningServer, start: int, num_prompt: int, max_tokens: int) -> dict:
    body = {"prompt": list(range(start, start + num_prompt)), "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    with server.client() as c:
        r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_lanes_get_their_own_ring_sizes(ring_server):
    complete(ring_server, 1000, 20, 4)  # needed round_up(20 + 4 + 16) = 48 < 256: the default ring
    complete(ring_server, 2000, 230, 12)  # needed 258 >= 256: the cap
    with ring_server.client() as c:
        slots = c.get("/slots").json()
    rings = sorted(s["ring"]["ring_cells"] for s in slots if s["ring"] is not None)
    assert rings == [64, 256]
    for s in slots:
        if s["ring"] is not None:
            assert s["ring"]["pages_read"] > 0 and 0 <= s["ring"]["hit_ratio"] <= 1
    m = ring_server.metrics()
    lane_cells = sorted(v for k, v in m.items() if k.startswith("strata_kv_ring_cells{"))
    assert lane_cells == [64.0, 256.0]
    assert m["strata_kv_ring_budget_cells"] == 384.0
    # one layer group (no windows): the per-group families have its one row
    assert [k for k in m if k.startswith("strata_kv_ring_group_arena_cells")] == [
        'strata_kv_ring_group_arena_cells{window="full"}']
    assert m['strata_kv_ring_group_arena_cells{window="full"}'] == 384.0
    # Each context fits its lane's ring (24 cells in 64, 242 in 256): no page passes through
    # staging, and the pages admitted into the rings are written there first (no copy).
    assert m["strata_kv_ring_pages_streamed_total"] == 0 and m["strata_kv_ring_pages_admitted_total"] > 0
    assert m["strata_kv_ring_bytes_streamed_total"] == 0
    assert m["strata_kv_ring_budget_fallbacks_total"] == 0


def test_a_spent_budget_keeps_the_default_ring(ring_server):
    """Two long requests at once: the budget (384) gives the first 256; the second would need
    256 more, so it keeps 64 and the fallback counter says so. "At once": the engine's steps
    wait at the gate until both requests are in, so neither can end before the other is admitted."""
    import concurrent.futures

    m = ring_server.metrics()
    before, streamed = m["strata_kv_ring_budget_fallbacks_total"], m["strata_kv_ring_pages_streamed_total"]
    gate = ring_server.gate
    gate.hold()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            running = pool.map(lambda s: complete(ring_server, s, 230, 12), (3000, 4000))
            ring_server.wait_submitted(2)
            gate.release()
            done = list(running)
    finally:
        gate.release()
    assert all(d["usage"]["completion_tokens"] == 12 for d in done)
    with ring_server.client() as c:
        rings = sorted(s["ring"]["ring_cells"] for s in c.get("/slots").json() if s["ring"] is not None)
    assert 64 in rings and 256 in rings
    m = ring_server.metrics()
    assert m["strata_kv_ring_budget_fallbacks_total"] == before + 1
    # The lane kept at 64 cells reads a context of 242: 16 pages, at most 4 resident, the rest streamed.
    assert m["strata_kv_ring_pages_streamed_total"] > streamed

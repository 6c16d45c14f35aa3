"""The expert cache and the device budget in serve: a tiny OLMoE with 3 of 8 experts per
layer resident, prefetch on, a ring and a device budget. Its counters show in /metrics
(`strata_moe_*`), /slots (each lane's `moe`) and the Monitor's feed; two requests decode the
all-resident tokens."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serving import RunningServer, engine_loader, start_server
from test_webapp_http import feed_frames

from strata.server.settings import ServerSettings
from tests.conftest import require
from tests.model.test_moe_parity import tiny_moe_dir

require("transformers")

MOE = {"dtype": "float32", "max_context": 256, "batch": 1, "kv_chunk": 16, "kv_resident": 64, "kv_page": 16,
       "moe_resident": 3, "moe_prefetch": True, "device_memory": 1024, "spec": "off"}


@pytest.fixture(scope="module")
def tiny_olmoe(tmp_path_factory, smol_tokenizer) -> str:
    return tiny_moe_dir("olmoe", tmp_path_factory, smol_tokenizer)


@pytest.fixture(scope="module")
def moe_server(tiny_olmoe) -> Iterator[RunningServer]:
    running = start_server(ServerSettings(model_alias="tiny"), engine_loader(tiny_olmoe, **MOE), "tiny")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def plain_server(tiny_olmoe) -> Iterator[RunningServer]:
    running = start_server(ServerSettings(model_alias="tiny"), engine_loader(tiny_olmoe, dtype="float32",
                                                                            max_context=256, spec="off"), "tiny")
    yield running
    running.stop()


def complete(server: RunningServer, start: int) -> str:
    body = {"prompt": list(range(start, start + 20)), "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    with server.client() as c:
        r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def test_counters_in_metrics_slots_and_the_monitor(moe_server, plain_server):
    for start in (1000, 2000):
        assert complete(moe_server, start) == complete(plain_server, start)
    m = moe_server.metrics()
    assert m["strata_moe_expert_slots"] == 3.0
    assert m["strata_moe_expert_hits_total"] + m["strata_moe_expert_misses_total"] > 0
    assert m["strata_moe_expert_misses_total"] > 0 and m["strata_moe_bytes_copied_total"] > 0
    assert m["strata_moe_expert_prefetches_total"] > 0 and m["strata_moe_tokens_total"] >= 2 * (20 + 8) - 2
    assert 0 < m["strata_moe_hit_ratio"] < 1 and m["strata_moe_bytes_copied_per_token"] > 0
    assert sum(v for k, v in m.items() if k.startswith("strata_moe_layer_misses_total{")) == \
        m["strata_moe_expert_misses_total"]
    assert m['strata_moe_budget_split_bytes{part="expert"}'] > 0 and m["strata_moe_budget_bytes"] == 1024 * 2**20
    with moe_server.client() as c:
        slots = c.get("/slots").json()
    assert all(s["moe"]["expert_slots"] == 3 for s in slots)
    assert any(s["moe"]["budget_ring_cells"] for s in slots)
    frame = next(f for f in feed_frames(moe_server) if "moe" in f)
    assert frame["moe"]["resident"] == 3 and frame["moe"]["budget"]["expert_slots"] == 3

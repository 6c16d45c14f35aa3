"""Speculative decoding over HTTP: `timings` carries llama.cpp's draft_n / draft_n_accepted,
and /metrics counts the drafts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serving import RunningServer, engine_loader, start_server

from strata.server.settings import ServerSettings

SPEC = {"dtype": "float32", "max_context": 512, "batch": 1, "kv_chunk": 64, "kv_pool_tokens": 2048,
        "spec": "ngram", "spec_k": 4}
TEXT = "def add(a, b):\n    return a + b\n\n" * 3


@pytest.fixture(scope="module")
def spec_server(gguf_path) -> Iterator[RunningServer]:
    running = start_server(ServerSettings(model_alias="smol"), engine_loader(gguf_path, **SPEC))
    yield running
    running.stop()


def test_drafts_in_timings_and_metrics(spec_server):
    body = {"messages": [{"role": "user", "content": f"Repeat exactly:\n{TEXT}"}],
            "max_tokens": 40, "temperature": 0}
    with spec_server.client() as c:
        r = c.post("/v1/chat/completions", json=body)
        slots = c.get("/slots").json()
    assert r.status_code == 200, r.text
    timings = r.json()["timings"]
    assert timings["draft_n"] >= timings["draft_n_accepted"] > 0
    assert "return a + b" in r.json()["choices"][0]["message"]["content"]
    assert all(s["spec"] is None for s in slots)  # nothing is running
    m = spec_server.metrics()
    assert m["strata_spec_draft_tokens_total"] >= timings["draft_n"]
    assert m["strata_spec_accepted_tokens_total"] >= timings["draft_n_accepted"]
    assert 0 < m["strata_spec_acceptance_ratio"] <= 1

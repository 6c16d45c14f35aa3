"""Real servers for the server tests (see serving.py), one per engine configuration, shared
by the whole session because loading costs seconds:
- `main_server`: float32 (greedy parity with the offline API is exact), a roomy pool, an API key, a 1 MiB body limit,
  a step gate (step_gate.py, open unless a test holds it);
- `pool_server`: bfloat16 (faster here; nothing compares its text), a pool of 16 chunks of 16 cells (one 256-cell conversation fills it),
  streams that start at once (`sse_keepalive_s=0`), at most one waiting request, and a step gate.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serving import API_KEY, MAIN_ENGINE, POOL_ENGINE, RunningServer, engine_loader, start_server
from step_gate import StepGate

from strata.server.settings import ServerSettings


@pytest.fixture(scope="session")
def main_server(gguf_path) -> Iterator[RunningServer]:
    settings = ServerSettings(
        api_key=API_KEY, model_alias="smol", sse_keepalive_s=5.0, max_body_bytes=1 << 20
    )
    running = start_server(settings, engine_loader(gguf_path, gate=StepGate(), **MAIN_ENGINE))
    yield running
    running.stop()


@pytest.fixture(scope="session")
def pool_server(gguf_path) -> Iterator[RunningServer]:
    settings = ServerSettings(model_alias="smol", sse_keepalive_s=0.0, max_waiting=1)
    running = start_server(settings, engine_loader(gguf_path, gate=StepGate(), **POOL_ENGINE))
    yield running
    running.stop()

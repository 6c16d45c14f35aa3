"""The default model decodes the same greedy tokens with the fused CPU ops as with torch's.

float32 compute (text is exact only there), several lanes at once, in both layouts and a
pool whose lanes interleave their chunks.
"""

from __future__ import annotations

import pytest

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.sampling import SamplingParams
from tests.conftest import require_default_model

PROMPTS = ["Write one sentence about the sea.", "What is 17 times 23?", "Name three colours.",
           "Tell me a fun fact about octopuses."]


def run(engine: Engine, fused: bool) -> list[list[int]]:
    ops = engine._model.ops
    engine._model.ops = ops if fused else None
    try:
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        ids = [engine.submit(engine.tokenizer.encode_chat([{"role": "user", "content": p}]), params)
               for p in PROMPTS]
        out = {i: [] for i in ids}
        for o in engine.run_until_done():
            out[o.request_id].extend(o.new_token_ids)
        engine._scheduler.clear_cache()
        return [out[i] for i in ids]
    finally:
        engine._model.ops = ops


@pytest.mark.parametrize("pool", [None, 512])
def test_fused_and_torch_ops_decode_the_same_tokens(decode_ops, pool):
    require_default_model()
    # kv_chunk 16 with a pool: four lanes growing together interleave their chunks.
    e = Engine(EngineConfig(dtype="float32", max_context=128, batch=3, kv_chunk=16, kv_pool_tokens=pool,
                            prefill_chunk=64), progress=False)
    assert e._model.ops is decode_ops
    assert run(e, fused=True) == run(e, fused=False)

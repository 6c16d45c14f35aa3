"""The default model decodes transformers' greedy tokens on every decode path (the fused CPU
ops where the CPU has AVX2, torch's ops everywhere: tests/conftest.py's DECODE_PATHS).

float32 compute (text is exact only there), four lanes decoding together, in both layouts
and a pool whose lanes interleave their chunks.
"""

from __future__ import annotations

import os

import pytest
import torch

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.sampling import SamplingParams
from tests.conftest import require

PROMPTS = ["Write one sentence about the sea.", "What is 17 times 23?", "Name three colours.",
           "Tell me a fun fact about octopuses."]
NEW = 24


@pytest.fixture(scope="module")
def expected(gguf_path, smol_tokenizer) -> list[list[int]]:
    """transformers' float32 greedy continuation of each prompt, one at a time."""
    transformers = require("transformers")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32).eval()
    out = []
    for p in PROMPTS:
        ids = smol_tokenizer.encode_chat([{"role": "user", "content": p}])
        with torch.inference_mode():
            gen = ref.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                               pad_token_id=0)
        out.append(gen[0, len(ids):].tolist())
    return out


@pytest.mark.parametrize("pool", [None, 512])
def test_every_decode_path_decodes_transformers_tokens_in_a_batch(decode_path, expected, gguf_path, pool):
    # kv_chunk 16 with a pool: four lanes growing together interleave their chunks.
    e = Engine(EngineConfig(model=gguf_path, dtype="float32", max_context=128, batch=3, kv_chunk=16,
                            kv_pool_tokens=pool, prefill_chunk=64, fused=decode_path == "fused"), progress=False)
    assert (e._model.ops is not None) == (decode_path == "fused")
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    ids = [e.submit(e.tokenizer.encode_chat([{"role": "user", "content": p}]), params) for p in PROMPTS]
    out = {i: [] for i in ids}
    for o in e.run_until_done():
        out[o.request_id].extend(o.new_token_ids)
    assert [out[i] for i in ids] == expected

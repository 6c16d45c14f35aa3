"""int8 K/V on the default model: a quality bound that a broken scale would fail.

A fixed prompt set (chats through the chat template, code, a few hundred tokens of mixed
text) in float32 compute, so the figures hold on any CPU: top-1 agreement per position of
int8 K/V against float32 K/V must stay above MIN_TOP1, measured at 98.7 % (see
benchmarks/kv_quality.py for the full table in bfloat16). A scale broken by 4x (monkey-
patched into the quantiser) must fall below it: the bound can fail.
"""

from __future__ import annotations

import pytest
import torch

import strata.cells.int8 as quant
from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.testing import prompt_logits

MIN_TOP1 = 0.95
CHATS = ["Write a haiku about tides.", "Why is the sky blue?", "What is 17 times 23?",
         "Give me three tips for a job interview.", "Explain photosynthesis to a ten-year-old."]
CODE = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
MIXED = ("The river ran brown after the storm, carrying branches past the old mill. " * 3
         + "A hash table maps keys to values by computing an index into an array of buckets. " * 3
         + CODE * 2 + "Penguins huddle together to conserve heat during the Antarctic winter. " * 3)


@pytest.fixture(scope="module")
def engines(gguf_path):
    return {kv: Engine(EngineConfig(model=gguf_path, dtype="float32", kv=kv, max_context=512), progress=False)
            for kv in ("f32", "int8")}


@pytest.fixture(scope="module")
def prompts(engines):
    tok = engines["f32"].tokenizer
    chats = [tok.encode_chat([{"role": "user", "content": c}]) for c in CHATS]
    code = tok.encode_chat([{"role": "user", "content": f"Explain this code:\n```\n{CODE}```"}])
    return [*chats, code, tok.encode(MIXED)]


@pytest.fixture(scope="module")
def reference(engines, prompts):
    return [prompt_logits(engines["f32"], p).argmax(-1) for p in prompts]


def top1_agreement(engine: Engine, prompts, reference) -> float:
    same = sum((prompt_logits(engine, p).argmax(-1) == ref).sum().item() for p, ref in zip(prompts, reference))
    return same / sum(len(p) for p in prompts)


def test_int8_top1_agreement_is_above_the_bound(engines, prompts, reference):
    agree = top1_agreement(engines["int8"], prompts, reference)
    print(f"int8 K/V top-1 agreement with f32 K/V: {agree:.4f} over {sum(map(len, prompts))} positions")
    assert agree >= MIN_TOP1


def test_a_broken_scale_falls_below_the_bound(engines, prompts, reference, monkeypatch):
    real = quant.quantise

    def broken(x):
        q, scale = real(x)
        return q, scale * 4

    monkeypatch.setattr(quant, "quantise", broken)
    # every write through `Int8Cells.write` and so the broken quantiser (the fused rope-write
    # quantises as it does, code for code: tests/unit/test_int8_write.py)
    monkeypatch.setattr(quant.Int8Cells, "write_targets", lambda *args: None)
    agree = top1_agreement(engines["int8"], prompts, reference)
    print(f"int8 K/V with a 4x scale: top-1 agreement {agree:.4f}")
    assert agree < MIN_TOP1


def test_the_memory_guard_counts_int8_bytes_and_scales(tiny_llama_dir, monkeypatch):
    import strata.engine.build as engine_module
    from strata.cells.storage import kv_bytes_per_cell

    plans = {}
    for kv in ("bf16", "int8"):
        monkeypatch.setattr(engine_module, "check_memory", lambda plan, *a, kv=kv: plans.setdefault(kv, plan))
        e = Engine(EngineConfig(model=tiny_llama_dir, kv=kv, max_context=128, kv_chunk=64, kv_pool_tokens=256),
                   progress=False)
        cfg = e.model_config
        assert plans[kv].kv_bytes == 256 * kv_bytes_per_cell(kv, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        assert plans[kv].kv_bytes == e._kv.num_bytes
    head_dim = e.model_config.head_dim
    assert plans["int8"].kv_bytes / plans["bf16"].kv_bytes == (head_dim + 2) / (2 * head_dim)

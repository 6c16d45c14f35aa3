"""Gemma 3 (`gemma3_text`) on a tiny random config against transformers in float32, with a
window of 8 cells: logits and greedy tokens for prompts shorter and longer than the window,
on every decode path (fused kernel spans, torch reads), with prefill pieces and chunks of
4, 8 and 16 cells (below, at and above the window).

Its layers interleave sliding and global attention (sliding, global, sliding, sliding), the
norms are random (Gemma scales by 1 + w), and query_pre_attn_scalar differs from head_dim,
so a wrong window, RoPE base, norm offset or query scale changes the logits.
"""

from __future__ import annotations

import pytest
import torch

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.llm import LLM
from strata.sampling import SamplingParams
from strata.testing import prompt_logits
from tests.conftest import make_tiny_model, require
from tests.model.test_parity import assert_logits_close

transformers = require("transformers")

WINDOW = 8
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
GEMMA3 = {"sliding_window": WINDOW, "head_dim": 16, "query_pre_attn_scalar": 24, "num_hidden_layers": 4,
          "layer_types": LAYER_TYPES, "tie_word_embeddings": True, "rope_theta": 10_000.0,
          "rope_local_base_freq": 500.0}
SHORT = "Hello there"  # shorter than the window
LONG = "The quick brown fox jumps over the lazy dog. Ünïcödé, 日本語, emoji 🙂 and numbers 12345."


def tiny_gemma3_dir(tmp_path_factory, tokenizer) -> str:
    return make_tiny_model("gemma3_text", str(tmp_path_factory.mktemp("tiny-gemma3")), tokenizer, **GEMMA3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, smol_tokenizer):
    path = tiny_gemma3_dir(tmp_path_factory, smol_tokenizer)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, ref


def test_the_config_names_each_layers_window(tiny):
    from strata.loader.hf_dir import hf_model_config

    cfg = hf_model_config(tiny[0])
    assert cfg.arch == "gemma3_text" and cfg.layer_windows == (WINDOW, None, WINDOW, WINDOW)
    assert (cfg.rope_theta, cfg.rope_local_theta, cfg.query_pre_attn_scalar) == (10_000.0, 500.0, 24.0)
    assert cfg.tie_embeddings and cfg.qk_norm


@pytest.mark.parametrize("chunk", [4, 8, 16])
@pytest.mark.parametrize("text", [SHORT, LONG])
def test_tiny_gemma3_logits_match_transformers(tiny, smol_tokenizer, decode_path, chunk, text):
    path, ref = tiny
    ids = smol_tokenizer.encode(text)
    assert (len(ids) < WINDOW) == (text is SHORT)
    with torch.inference_mode():
        expected = ref(torch.tensor([ids])).logits[0].float()
    engine = Engine(EngineConfig(model=path, dtype="float32", max_context=128, kv_chunk=chunk, prefill_chunk=7,
                                 fused=decode_path == "fused"), progress=False)
    assert_logits_close(prompt_logits(engine, ids), expected)


@pytest.mark.parametrize("pooled", [False, True])
@pytest.mark.parametrize("text", [SHORT, LONG])
def test_tiny_gemma3_greedy_matches_transformers(tiny, smol_tokenizer, decode_path, text, pooled):
    """Decoding runs far past the window (24 tokens after the prompt): each decode step's
    windowed layers read only the last 8 cells, in place or through the kernel's spans."""
    path, ref = tiny
    ids = smol_tokenizer.encode(text)
    with torch.inference_mode():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    expected = out[0, len(ids):].tolist()
    pool = {"kv_pool_tokens": 4 * 128} if pooled else {}
    llm = LLM(model=path, dtype="float32", max_context=128, kv_chunk=8, batch=1, prefill_chunk=5,
              fused=decode_path == "fused", progress=False, **pool)
    (got,) = llm.generate([ids], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert list(got.token_ids) == expected


def test_a_full_attention_read_would_differ(tiny, smol_tokenizer, monkeypatch):
    """The window matters on this model: the same weights with every window's reads left
    as full attention's give other logits past the window (so the tests above can fail)."""
    import strata.runner.windows as windows

    path, ref = tiny
    ids = smol_tokenizer.encode(LONG)
    with torch.inference_mode():
        expected = ref(torch.tensor([ids])).logits[0].float()
    monkeypatch.setattr(windows, "window_meta", lambda full, *args, **kwargs: full)
    engine = Engine(EngineConfig(model=path, dtype="float32", max_context=128, kv_chunk=16), progress=False)
    got = prompt_logits(engine, ids)
    assert (got[WINDOW:] - expected[WINDOW:]).abs().max() > 1e-2
    torch.testing.assert_close(got[:WINDOW], expected[:WINDOW], rtol=1e-4, atol=1e-4)

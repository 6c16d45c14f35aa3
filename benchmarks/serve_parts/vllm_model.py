"""The vLLM arm's weights: vLLM loads safetensors, not this GGUF, so it reads a bf16 copy of
the same weights (dequantised by transformers, as the decode benchmark's transformers arm
holds them), written once next to the results and reused while it names the same file."""

from __future__ import annotations

import json
import os

MARKER = "strata-source.json"  # {"gguf": path, "size": bytes}: what the copy was made from


def bf16_copy(gguf_path: str, out_dir: str) -> str:
    """`out_dir` with config.json, bf16 safetensors and the tokenizer of `gguf_path`."""
    source = {"gguf": os.path.abspath(gguf_path), "size": os.path.getsize(gguf_path)}
    marker = os.path.join(out_dir, MARKER)
    try:
        with open(marker) as f:
            if json.load(f) == source:
                return _without_gguf_quantization(out_dir)
    except (OSError, ValueError):
        pass
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.dirname(gguf_path), os.path.basename(gguf_path)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
    # A model made from the config alone carries no GGUF loading state into what it saves.
    fresh = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.bfloat16)
    fresh.load_state_dict(loaded.state_dict())
    fresh.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out_dir)
    with open(marker, "w") as f:
        json.dump(source, f)
    return _without_gguf_quantization(out_dir)


def _without_gguf_quantization(out_dir: str) -> str:
    """transformers keeps `quantization_config: {quant_method: gguf}` in the config of a model
    loaded from a GGUF, though the tensors written are dense bf16; vLLM refuses that method."""
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    if config.pop("quantization_config", None) is not None:
        with open(path, "w") as f:
            json.dump(config, f, indent=2)
    return out_dir

"""Model loading: a GGUF file or a Hugging Face directory, to config + tensors + tokenizer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from strata.errors import LoaderError
from strata.loader.default import default_model_path
from strata.loader.fingerprint import weights_fingerprint
from strata.models.q4 import Q4Weight
from strata.loader.tokenizer import Tokenizer
from strata.models.config import ModelConfig


@dataclass
class ModelSource:
    """An opened model: its config, tokenizer, and a one-pass iterator of its tensors."""

    path: str
    config: ModelConfig
    tokenizer: Tokenizer
    num_tensors: int
    tensors: Iterator[tuple[str, torch.Tensor | Q4Weight]]  # (Hugging Face name, float32 tensor)
    fingerprint: str  # names the exact weights (session files check it)


def open_model(path: str | None = None, keep_q4: bool = False) -> ModelSource:
    """Opens `path` (a .gguf file or a Hugging Face directory); None means the default model.

    `keep_q4`: also yield GGUF 4-bit projections as stored (name + ".q4", see models/q4.py).
    """
    path = default_model_path() if path is None else path
    if os.path.isdir(path):
        from strata.loader.hf_dir import hf_model_config, iter_hf_tensors, safetensors_files

        config = hf_model_config(path)
        tokenizer = Tokenizer.from_hf_dir(path)
        files = safetensors_files(path)
        return ModelSource(path, config, tokenizer, len(files), iter_hf_tensors(path), weights_fingerprint(path, config))
    if not os.path.exists(path):
        raise LoaderError(f"model not found: {path} (pass a .gguf file or a Hugging Face directory)")
    from strata.loader.gguf_file import (
        check_tensor_data,
        gguf_model_config,
        iter_gguf_tensors,
        open_gguf,
    )

    reader = open_gguf(path)
    check_tensor_data(reader, path)
    tokenizer = Tokenizer.from_gguf(reader, path)
    config = gguf_model_config(reader, path, tokenizer.eos_token_ids)
    return ModelSource(
        path, config, tokenizer, len(reader.tensors), iter_gguf_tensors(reader, config, path, keep_q4),
        weights_fingerprint(path, config),
    )

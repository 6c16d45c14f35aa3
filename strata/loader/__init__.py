"""Model loading: a GGUF file or a Hugging Face directory, to config + tensors + tokenizer."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from strata.errors import LoaderError
from strata.loader import fingerprint
from strata.loader.default import default_model_path
from strata.loader.tokenizer import Tokenizer
from strata.models.config import ModelConfig
from strata.models.fused import load_quant_ops
from strata.models.quant import QuantWeight

log = logging.getLogger("strata.loader")

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class ModelSource:
    """An opened model: its config, tokenizer, and a one-pass iterator of its tensors."""

    path: str
    config: ModelConfig
    tokenizer: Tokenizer
    num_tensors: int
    # (Hugging Face name, float32 tensor), and (name + ".quant", QuantWeight) for GGUF
    # tensors kept as stored (loader/gguf_tensors.py)
    tensors: Iterator[tuple[str, torch.Tensor | QuantWeight]]
    fingerprint: str  # names the exact weights (session files check it)
    widened_q5_0_blocks: int = 0  # Q5_0 blocks the q8x8 form widens (gguf_file.widened_q5_0_blocks)


def open_model(path: str | None = None, weights: str = "dense", dtype: str = "bfloat16") -> ModelSource:
    """Opens `path` (a .gguf file or a Hugging Face directory); None means the default model.

    `weights` (`--weights` dense/auto/native) says which GGUF tensors are also, or only,
    yielded as their quantized bytes; `dtype` only sizes the warning about tensors that load
    dense. Every refusal comes before the vocabulary is parsed and any tensor is read or hashed.
    """
    path = default_model_path() if path is None else path
    if os.path.isdir(path):
        from strata.loader.hf_dir import hf_model_config, iter_hf_tensors, safetensors_files

        config = hf_model_config(path)
        tokenizer = Tokenizer.from_hf_dir(path)
        files = safetensors_files(path)
        return ModelSource(path, config, tokenizer, len(files), iter_hf_tensors(path),
                           fingerprint.weights_fingerprint(path, config))
    if not os.path.exists(path):
        raise LoaderError(f"model not found: {path} (pass a .gguf file or a Hugging Face directory)")
    from strata.loader import gguf_checks
    from strata.loader.gguf_file import gguf_model_config, open_gguf, widened_q5_0_blocks
    from strata.loader.gguf_tensors import iter_gguf_tensors

    reader = open_gguf(path)
    gguf_checks.check_tensor_data(reader, path)
    gguf_checks.check_architecture(reader, path)
    gguf_checks.check_tokenizer_kind(reader, path)
    config = gguf_model_config(reader, path)
    gguf_checks.check_tensor_names(reader, path, config)
    dense_only = gguf_checks.check_tensor_types(reader, path, kernels=load_quant_ops() is not None)
    if weights != "dense" and (warning := dense_only.warning(path, DTYPE_BYTES.get(dtype, 4), dtype)):
        log.warning(warning)
    tokenizer = Tokenizer.from_gguf(reader, path)
    config = dataclasses.replace(config, eos_token_ids=tuple(tokenizer.eos_token_ids))
    tensors = iter_gguf_tensors(reader, config, path, weights, TORCH_DTYPES.get(dtype, torch.float32))
    return ModelSource(path, config, tokenizer, len(reader.tensors), tensors, fingerprint.weights_fingerprint(path, config),
                       widened_q5_0_blocks(reader))

"""Build a model from an opened source: dtype, layer split across devices, progress bar."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch
from tqdm import tqdm

from strata.errors import LoaderError
from strata.loader import ModelSource
from strata.models.gemma3 import Gemma3Model
from strata.models.llama import LlamaModel
from strata.models.moe_model import MoeModel

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# ModelConfig.arch -> its model family's class (the rest: the Llama family).
FAMILIES = {"gemma3_text": Gemma3Model, "mixtral": MoeModel, "qwen2_moe": MoeModel, "qwen3_moe": MoeModel,
            "olmoe": MoeModel}


def split_layers(num_layers: int, devices: Sequence[str]) -> list[torch.device]:
    """Contiguous, near-equal runs of layers per device, in the order given."""
    n = len(devices)
    return [torch.device(devices[i * n // num_layers]) for i in range(num_layers)]


def _device_of(name: str, layer_devices: list[torch.device]) -> torch.device:
    if name.startswith("model.layers."):
        return layer_devices[int(name.split(".")[2])]
    if name in ("model.norm.weight", "lm_head.weight"):
        return layer_devices[-1]
    return layer_devices[0]


def build_model(
    source: ModelSource,
    dtype: str,
    devices: Sequence[str],
    max_positions: int,
    weight_mode: str = "dense",
    progress: bool = True,
    fused: bool = True,
) -> LlamaModel:
    cfg = source.config
    layer_devices = split_layers(cfg.num_layers, devices)
    torch_dtype = TORCH_DTYPES[dtype]
    weights: dict[str, torch.Tensor] = {}
    # disable=None: tqdm stays quiet when stderr is not a terminal (logs, pipes, CI).
    bar = tqdm(
        total=source.num_tensors, desc="loading weights", unit="tensor",
        disable=None if progress else True, leave=False,
    )
    for name, tensor in source.tensors:
        if name == "rope_freqs" or name.endswith(".quant"):  # QuantWeights stay as loaded, on the CPU
            weights[name] = tensor
        else:
            weights[name] = tensor.to(dtype=torch_dtype, device=_device_of(name, layer_devices))
        bar.update(1)
    bar.close()
    if cfg.tie_embeddings:
        weights.pop("lm_head.weight", None)
        weights.pop("lm_head.weight.quant", None)
    required = ["model.embed_tokens.weight", "model.norm.weight"] + (
        [] if cfg.tie_embeddings else ["lm_head.weight"]
    )
    for name in required:
        if name not in weights and name + ".quant" not in weights:
            raise LoaderError(f"{source.path}: tensor {name!r} is missing")
    try:
        family = FAMILIES.get(cfg.arch, LlamaModel)
        model = family(cfg, weights, torch_dtype, layer_devices, max_positions, weight_mode, fused)
    except KeyError as exc:
        raise LoaderError(f"{source.path}: tensor {exc.args[0]!r} is missing") from exc
    del weights
    _return_freed_memory()
    return model


def _return_freed_memory() -> None:
    """Give the heap that loading freed (float32 copies, unfused projections) back to the OS.

    glibc keeps freed blocks for reuse, so without this the process holds ~1.5x its weights
    after loading. Elsewhere (no glibc) this does nothing.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass

"""A GGUF file's tensors under Hugging Face names: dense, and/or the file's quantized bytes.

`weights` is the engine's `--weights`:
- dense: every tensor dequantised (float32 here; the build casts to the compute dtype);
- native: a 2-D tensor whose type a kernel reads in place (models/quant.py KERNEL_TYPES)
  yields only name + ".quant" -> QuantWeight, its bytes as stored; the rest load dense;
- auto: both for those tensors (the dense copy serves long prompt pieces).
Quantized bytes are read from the file with plain reads, not through gguf-py's memory map:
mapped pages count in the process's RSS beside the copy. llama-arch q/k rows are stored
permuted for llama.cpp's rotary layout (gguf_file.unpermute_qk): whole rows move, bytes intact.
A MoE layer's stacked experts [E, out, in] (loader/gguf_moe.py) are read once and yielded as
one expert's tensor each: the quantized ones as views of the stacked bytes (expert e's rows
e * out .. (e + 1) * out - 1), nothing copied.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from strata.errors import LoaderError
from strata.loader.gguf_file import NORM_PLUS_ONE_ARCHES, PERMUTED_QK_ARCHES, hf_name, unpermute_qk
from strata.models.config import ModelConfig
from strata.models.quant import KERNEL_TYPES, QuantWeight

WEIGHT_MODES = ("auto", "dense", "native")


def read_raw(f, offset: int, n_bytes: int, path: str, name: str) -> torch.Tensor:
    """uint8 [n_bytes]: the bytes at `offset` of the open file `f`."""
    out = torch.empty(n_bytes, dtype=torch.uint8)
    view = memoryview(out.numpy())
    f.seek(offset)
    got = 0
    while got < n_bytes:
        n = f.readinto(view[got:])
        if not n:
            raise LoaderError(f"{path}: tensor {name!r} ends past the end of the file")
        got += n
    return out


def permuted_heads(cfg: ModelConfig, name: str) -> int | None:
    """Heads whose q/k rows the file stores in llama.cpp's rotary order, or None."""
    if cfg.arch not in PERMUTED_QK_ARCHES:
        return None
    if name.endswith("q_proj.weight"):
        return cfg.num_heads
    if name.endswith("k_proj.weight"):
        return cfg.num_kv_heads
    return None


def iter_gguf_tensors(reader: GGUFReader, cfg: ModelConfig, path: str, weights: str = "dense",
                      dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor | QuantWeight]]:
    """Yields (Hugging Face name, tensor in HF's [out, in] layout: float32, or `dtype` for the
    dense copies of types read in place) and, per `weights`, (name + ".quant", QuantWeight).
    Names and types were checked first (gguf_checks.py)."""
    assert weights in WEIGHT_MODES
    with open(path, "rb", buffering=0) as f:
        for t in reader.tensors:
            name = hf_name(t.name, cfg.arch)
            assert name is not None, t.name
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            heads = permuted_heads(cfg, name)
            if "{e}" in name:
                yield from _stacked_experts(f, t, name, shape, path, weights, dtype)
                continue
            if t.tensor_type in KERNEL_TYPES and len(shape) == 2:
                qw = QuantWeight(read_raw(f, int(t.data_offset), int(t.n_bytes), path, t.name).view(shape[0], -1),
                                 int(t.tensor_type), shape[1])
                if heads is not None:
                    qw = qw.rows(unpermute_qk(torch.arange(shape[0]).unsqueeze(1), heads).squeeze(1))
                if weights != "native":
                    yield name, qw.dequantize(dtype)
                if weights != "dense":
                    yield name + ".quant", qw
                continue
            tensor = _dequantized(t, shape, path)
            if cfg.arch in NORM_PLUS_ONE_ARCHES and name.endswith("norm.weight"):
                tensor = tensor - 1.0  # the file's 1 + w -> HF's w (models/gemma3.py adds the 1)
            yield name, tensor if heads is None else unpermute_qk(tensor, heads)


def _stacked_experts(f, t, name: str, shape: tuple[int, ...], path: str, weights: str,
                     dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor | QuantWeight]]:
    """One tensor per expert of the stacked `t` [E, out, in]; `name` has "{e}" for the expert."""
    if len(shape) != 3:
        raise LoaderError(f"{path}: tensor {t.name!r} has shape {shape}, not [experts, out, in]")
    n, out, cols = shape
    if t.tensor_type in KERNEL_TYPES:
        raw = read_raw(f, int(t.data_offset), int(t.n_bytes), path, t.name).view(n * out, -1)
        for e in range(n):
            qw = QuantWeight(raw[e * out:(e + 1) * out], int(t.tensor_type), cols)
            if weights != "native":
                yield name.format(e=e), qw.dequantize(dtype)
            if weights != "dense":
                yield name.format(e=e) + ".quant", qw
        return
    stacked = _dequantized(t, shape, path)
    for e in range(n):
        yield name.format(e=e), stacked[e]


def _dequantized(t, shape: tuple[int, ...], path: str) -> torch.Tensor:
    """float32 `shape`: tensor `t` dequantised by gguf-py, an owned copy."""
    try:
        data = dequantize(np.asarray(t.data), t.tensor_type)
    except Exception as exc:
        raise LoaderError(f"{path}: tensor {t.name!r} is unreadable ({exc})") from exc
    if int(np.prod(shape)) != data.size:
        raise LoaderError(f"{path}: tensor {t.name!r} holds {data.size} values, shape says {shape}")
    return torch.from_numpy(np.array(data, dtype=np.float32)).reshape(shape)

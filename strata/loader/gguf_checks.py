"""Every refusal of a GGUF file, from its metadata and tensor table alone.

`open_model` runs these before it parses the vocabulary, reads a tensor's data or hashes
the file (the fingerprint): a file strata cannot run fails in the time it takes to parse
the header, naming what it cannot run. Order: truncation, architecture, tokenizer kind,
metadata (the config), tensor names (unexpected and missing), tensor types.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from strata.errors import LoaderError
from strata.loader.gguf_file import GGUF_ARCHES, field_value, hf_name
from strata.loader.gguf_moe import REFUSED_MOE_ARCHES, missing_experts, moe_required
from strata.models.config import ModelConfig
from strata.models.quant import KERNEL_TYPES

FLOAT_TYPES = frozenset({QT.F32, QT.F16, QT.BF16})
# tokenizer.ggml.model values the tokenizer builds: byte-level BPE ('gpt2'), SentencePiece ('llama').
TOKENIZER_KINDS = ("gpt2", "llama")
# GGUF names every layer needs, and the top-level ones (output.weight unless tied).
ATTENTION_REQUIRED = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                      "ffn_norm.weight")
LAYER_REQUIRED = ATTENTION_REQUIRED + ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
TOP_REQUIRED = ("token_embd.weight", "output_norm.weight")
# and the ones a family needs beyond them
LAYER_REQUIRED_BY_ARCH = {"gemma3_text": ("post_attention_norm.weight", "post_ffw_norm.weight",
                                          "attn_q_norm.weight", "attn_k_norm.weight")}


def gguf_reads(qtype: QT) -> bool:
    """gguf-py dequantises `qtype` (probed on one zero block, so a newer gguf-py reads more)."""
    if qtype in FLOAT_TYPES:
        return True
    size = GGML_QUANT_SIZES.get(qtype)
    if size is None:
        return False
    try:
        dequantize(np.zeros((1, size[1]), np.uint8), qtype)
    except Exception:  # NotImplementedError, or a type gguf-py lists but cannot unpack
        return False
    return True


def supported_types() -> list[str]:
    """Names of every type strata reads (in place or dense), sorted."""
    return sorted(q.name for q in QT if gguf_reads(q))


@dataclass(frozen=True)
class DenseOnly:
    """Quantized tensors no kernel reads in place: they load dense (float32 or bfloat16)."""

    types: dict[str, int] = field(default_factory=dict)  # type name -> tensors of it
    values: int = 0  # weights in them
    file_bytes: int = 0  # what the file spends on them
    kernels: bool = True  # strata's in-place kernels run in this process

    def warning(self, path: str, dtype_bytes: int, dtype: str) -> str | None:
        if not self.types:
            return None
        names = ", ".join(f"{t} ({n} tensor{'s' * (n != 1)})" for t, n in sorted(self.types.items()))
        why = (f"have no in-place kernel (strata reads {', '.join(sorted(t.name for t in KERNEL_TYPES))} in place)"
               if self.kernels else "are not read in place here: strata's quantized kernels are not built "
               "(strata/_decode_ops) or this CPU lacks AVX2")
        return (f"{path}: {names} {why}: they load dense, {self.values * dtype_bytes / 2**20:.0f} MiB in {dtype} "
                f"instead of the file's {self.file_bytes / 2**20:.0f} MiB")


def check_tensor_data(reader: GGUFReader, path: str) -> None:
    """A truncated file maps tensor data past its end: say so before reading any."""
    size = os.path.getsize(path)
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise LoaderError(f"{path} is truncated: tensor {t.name!r} ends at byte {end}, the file has {size}")


def check_architecture(reader: GGUFReader, path: str) -> str:
    arch = field_value(reader, "general.architecture")
    if arch is None:
        raise LoaderError(f"{path}: GGUF metadata 'general.architecture' is missing")
    if arch in REFUSED_MOE_ARCHES:
        raise LoaderError(f"{path}: architecture {arch!r} is a mixture of experts strata does not run (its "
                          "mixtures of experts: llama with experts (Mixtral), qwen2moe, qwen3moe, olmoe)")
    if arch not in GGUF_ARCHES:
        raise LoaderError(f"{path}: architecture {arch!r} is not supported (strata runs {', '.join(GGUF_ARCHES)})")
    return arch


def check_tokenizer_kind(reader: GGUFReader, path: str) -> str:
    """`tokenizer.ggml.model` names a vocabulary kind the tokenizer builds."""
    kind = field_value(reader, "tokenizer.ggml.model")
    if kind not in TOKENIZER_KINDS:
        raise LoaderError(f"{path}: tokenizer.ggml.model {kind!r} is not supported "
                          f"(strata reads {' and '.join(repr(k) for k in TOKENIZER_KINDS)})")
    return kind


def check_tensor_names(reader: GGUFReader, path: str, cfg: ModelConfig) -> None:
    names = {t.name for t in reader.tensors}
    for t in reader.tensors:
        if hf_name(t.name, cfg.arch) is None:
            raise LoaderError(f"{path}: unexpected tensor {t.name!r} for architecture {cfg.arch}")
    required = list(TOP_REQUIRED) + ([] if cfg.tie_embeddings else ["output.weight"])
    extra = LAYER_REQUIRED_BY_ARCH.get(cfg.arch, ())
    for i in range(cfg.num_layers):
        if cfg.is_moe_layer(i):
            required += [f"blk.{i}.{n}" for n in ATTENTION_REQUIRED + extra + moe_required(cfg)]
            if (name := missing_experts(names, cfg, i)) is not None:
                raise LoaderError(f"{path}: tensor {name!r} (layer {i}'s experts) is missing")
        elif f"blk.{i}.ffn_gate_exps.weight" in names:  # experts without a router
            raise LoaderError(f"{path}: tensor 'blk.{i}.ffn_gate_inp.weight' (layer {i}'s router) is missing")
        else:
            required += [f"blk.{i}.{n}" for n in LAYER_REQUIRED + extra]
    for name in required:
        if name not in names:
            raise LoaderError(f"{path}: tensor {name!r} ({hf_name(name, cfg.arch)}) is missing")


def check_tensor_types(reader: GGUFReader, path: str, kernels: bool = True) -> DenseOnly:
    """Every tensor's type is one strata reads (in place or dense); which load dense (every
    quantized type when `kernels` is False: no in-place kernel runs in this process)."""
    counts: dict[str, int] = {}
    values = file_bytes = 0
    readable: dict[QT, bool] = {}
    for t in reader.tensors:
        qtype = t.tensor_type
        if qtype not in readable:
            readable[qtype] = gguf_reads(qtype)
        if not readable[qtype]:
            raise LoaderError(f"{path}: tensor {t.name!r} has type {qtype.name}, which strata cannot read "
                              f"(supported: {', '.join(supported_types())})")
        if (qtype not in KERNEL_TYPES or not kernels) and qtype not in FLOAT_TYPES:
            counts[qtype.name] = counts.get(qtype.name, 0) + 1
            values += int(np.prod([int(d) for d in t.shape]))
            file_bytes += int(t.n_bytes)
    return DenseOnly(counts, values, file_bytes, kernels)

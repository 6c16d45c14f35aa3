"""A GGUF file: its reader, metadata to ModelConfig, tensor names to Hugging Face names.

Refusals are in gguf_checks.py, the tensors themselves in gguf_tensors.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.constants import GGML_QUANT_SIZES

from strata.errors import LoaderError
from strata.models.config import MOE_ARCHITECTURES, ModelConfig
from strata.models.q4x8 import x8_form

# GGUF architecture -> Hugging Face model_type.
# (`llama` with experts is Mixtral: loader/gguf_moe.py.)
GGUF_ARCHES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text",
               "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "olmoe": "olmoe"}

# GGUF tensor name -> Hugging Face name; `{i}` is the layer index.
TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Gemma 3 (ModelConfig.arch gemma3_text): four norms per layer; ffn_norm is the pre-feedforward one.
GEMMA3_LAYER_NAMES = {
    **LAYER_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
LAYER_NAMES_BY_ARCH = {"gemma3_text": GEMMA3_LAYER_NAMES}
# llama.cpp's Gemma converter stores norm weights as 1 + w (HF's w): the loader takes the 1 off.
NORM_PLUS_ONE_ARCHES = frozenset({"gemma3_text"})
# What llama.cpp assumes of a Gemma 3 file that does not say: every 6th layer global, the
# sliding layers' RoPE base 10000, queries scaled by head_dim ** -0.5.
GEMMA3_SLIDING_PATTERN = 6
GEMMA3_LOCAL_THETA = 10_000.0
# GGML type ids gguf-py can lay out (an enum value with a block size).
_KNOWN_TYPE_IDS = frozenset(int(q) for q in GGMLQuantizationType if q in GGML_QUANT_SIZES)
# llama.cpp's rotary layout for these arches stores q/k rows permuted; undo it on load.
PERMUTED_QK_ARCHES = frozenset({"llama", "mistral", "mixtral"})


class _PastEnd(Exception):
    def __init__(self, end: int):
        super().__init__(end)
        self.end = end


class _UnknownType(Exception):
    def __init__(self, tensor: str, type_id: int):
        super().__init__(tensor, type_id)
        self.tensor, self.type_id = tensor, type_id


class _Reader(GGUFReader):
    """GGUFReader that stops at a read past the end of the file (gguf-py slices its memory
    map short there and fails later with an unrelated numpy error) and at a tensor whose
    type id gguf-py does not know (it fails with a bare ValueError naming no tensor)."""

    def _get(self, offset, dtype, count=1, override_order=None):
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if end > len(self.data):
            raise _PastEnd(end)
        return super()._get(offset, dtype, count, override_order)

    def _build_tensors(self, start_offs, fields) -> None:
        for f in fields:  # parts: name length, name bytes, n_dims, dims, type id, data offset
            type_id = int(f.parts[4][0])
            if type_id not in _KNOWN_TYPE_IDS:
                raise _UnknownType(bytes(f.parts[1]).decode("utf-8", "replace"), type_id)
        super()._build_tensors(start_offs, fields)


def open_gguf(path: str) -> GGUFReader:
    if not os.path.isfile(path):
        raise LoaderError(f"model file not found: {path}")
    try:
        return _Reader(path, "r")
    except _PastEnd as exc:
        raise LoaderError(
            f"{path} is truncated: reading it needs {exc.end} bytes, the file has {os.path.getsize(path)}"
        ) from exc
    except _UnknownType as exc:
        from strata.loader.gguf_checks import supported_types  # gguf_checks imports this module

        raise LoaderError(f"{path}: tensor {exc.tensor!r} has GGML type id {exc.type_id}, which gguf-py "
                          f"{gguf_version()} does not know and strata cannot read "
                          f"(supported: {', '.join(supported_types())})") from exc
    except Exception as exc:  # gguf raises ValueError, struct/numpy errors on bad files
        raise LoaderError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from exc


def gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(unknown version)"


def field_value(reader: GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception as exc:
        raise LoaderError(f"GGUF metadata {key!r} is unreadable: {exc}") from exc


def _require(reader: GGUFReader, key: str, path: str):
    value = field_value(reader, key)
    if value is None:
        raise LoaderError(f"{path}: GGUF metadata {key!r} is missing")
    return value


def gguf_model_config(reader: GGUFReader, path: str, eos_token_ids: tuple[int, ...] = ()) -> ModelConfig:
    """The config from metadata alone (the architecture already checked, gguf_checks.py); the
    tokenizer's end-of-turn ids join `eos_token_ids` later (loader/__init__.py)."""
    gguf_arch = _require(reader, "general.architecture", path)
    a = gguf_arch
    hidden = int(_require(reader, f"{a}.embedding_length", path))
    num_heads = int(_require(reader, f"{a}.attention.head_count", path))
    num_kv_heads = int(field_value(reader, f"{a}.attention.head_count_kv", num_heads))
    head_dim = int(field_value(reader, f"{a}.attention.key_length", hidden // num_heads))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = field_value(reader, f"{a}.vocab_size")
    if vocab is None:
        vocab = len(tokens.data) if tokens is not None else None
    if vocab is None:
        raise LoaderError(f"{path}: neither {a}.vocab_size nor tokenizer.ggml.tokens is present")
    names = {t.name for t in reader.tensors}
    rope_scaling = None
    scaling_type = field_value(reader, f"{a}.rope.scaling.type")
    if scaling_type == "linear":
        rope_scaling = {
            "rope_type": "linear",
            "factor": float(_require(reader, f"{a}.rope.scaling.factor", path)),
        }
    elif scaling_type not in (None, "none"):
        raise LoaderError(f"{path}: rope scaling {scaling_type!r} is not supported")
    num_layers = int(_require(reader, f"{a}.block_count", path))
    family = gemma3_fields(reader, num_layers, head_dim) if gguf_arch == "gemma3" else {}
    from strata.loader.gguf_moe import moe_arch, moe_config_fields  # it imports this module

    arch = moe_arch(reader, gguf_arch) or GGUF_ARCHES[gguf_arch]
    if arch in MOE_ARCHITECTURES:
        family = moe_config_fields(reader, gguf_arch, arch, num_layers, path)
    ffn = field_value(reader, f"{a}.feed_forward_length")
    if ffn is None and not family.get("num_experts"):
        ffn = _require(reader, f"{a}.feed_forward_length", path)
    return ModelConfig(
        **family,
        arch=arch,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(ffn if ffn is not None else family["expert_intermediate_size"]),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(_require(reader, f"{a}.attention.layer_norm_rms_epsilon", path)),
        rope_theta=float(field_value(reader, f"{a}.rope.freq_base", 10000.0)),
        max_position=int(field_value(reader, f"{a}.context_length", 4096)),
        tie_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        rope_scaling=rope_scaling,
        bos_token_id=field_value(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=eos_token_ids,
        name=str(field_value(reader, "general.name", os.path.basename(path))),
    )


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor of ModelConfig.arch `arch`, or None."""
    if gguf_name in TOP_NAMES:
        return TOP_NAMES[gguf_name]
    if gguf_name == "rope_freqs.weight":
        return "rope_freqs"  # llama3-style per-frequency factors, kept as their own tensor
    names = LAYER_NAMES_BY_ARCH.get(arch, LAYER_NAMES)
    parts = gguf_name.split(".", 2)
    if len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit():
        return None
    if parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}"
    if arch in MOE_ARCHITECTURES:
        from strata.loader.gguf_moe import moe_layer_name  # it imports this module

        rest = moe_layer_name(parts[2])
        return None if rest is None else f"model.layers.{parts[1]}.{rest}"
    return None


def gemma3_fields(reader: GGUFReader, num_layers: int, head_dim: int) -> dict:
    """ModelConfig fields of a `gemma3` file beyond the Llama family's."""
    a = "gemma3"
    window = field_value(reader, f"{a}.attention.sliding_window")
    pattern = int(field_value(reader, f"{a}.attention.sliding_window_pattern", GEMMA3_SLIDING_PATTERN))
    windows = () if window is None else tuple(
        int(window) if (i + 1) % pattern else None for i in range(num_layers))
    return {
        "layer_windows": windows,
        "rope_local_theta": float(field_value(reader, f"{a}.rope.freq_base_swa", GEMMA3_LOCAL_THETA)),
        "query_pre_attn_scalar": float(head_dim),
    }


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's interleaved-rotary row order: rows [h, d/2, 2] -> [h, 2, d/2]."""
    out_features = w.shape[0]
    head_dim = out_features // num_heads
    rest = w.shape[1:]
    return w.reshape(num_heads, head_dim // 2, 2, *rest).transpose(1, 2).reshape(out_features, *rest)


# Tensors one projection reads side by side (models/llama.py, models/moe_block.py fuse them).
FUSED_GROUPS = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"), ("ffn_gate_exps", "ffn_up_exps"),
                ("ffn_gate_shexp", "ffn_up_shexp"))


def widened_q5_0_blocks(reader: GGUFReader) -> int:
    """Q5_0 blocks that `--weights auto` holds in the q8x8 form (34 bytes a block, not 22): those
    of a projection whose parts mix Q5_0 and Q8_0 (q4x8.x8_form, as models/linear.py chooses;
    Q5_0 alone keeps its size in the q5x8 form). From the tensor table: no data read."""
    q5_0 = GGMLQuantizationType.Q5_0
    types = {t.name: t.tensor_type for t in reader.tensors}
    blocks = 0
    for t in reader.tensors:
        if t.tensor_type != q5_0 or not t.name.startswith("blk."):
            continue
        prefix, _, rest = t.name.rpartition(".weight")[0].rpartition(".")
        group = next((g for g in FUSED_GROUPS if rest in g), (rest,))
        parts = [types.get(f"{prefix}.{n}.weight") for n in group]
        if x8_form(parts) == "q8x8":
            blocks += int(t.n_bytes) // GGML_QUANT_SIZES[q5_0][1]
    return blocks

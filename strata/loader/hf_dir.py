"""A Hugging Face model directory: config.json, safetensors (single or sharded)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import torch
from safetensors import safe_open

from strata.errors import LoaderError
from strata.loader.hf_families import gemma3_fields, layer_windows
from strata.loader.hf_moe import moe_fields, moe_tensors
from strata.models.config import ARCHITECTURES, MOE_ARCHITECTURES, ModelConfig


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        raise LoaderError(f"missing file: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise LoaderError(f"{path} is not valid JSON: {exc}") from exc


def _rope(cfg: dict) -> tuple[float, dict | None]:
    """rope_theta and scaling, from transformers 4 (`rope_theta`, `rope_scaling`) or 5 (`rope_parameters`)."""
    params = cfg.get("rope_parameters") or {}
    theta = float(cfg.get("rope_theta", params.get("rope_theta", 10000.0)))
    scaling = cfg.get("rope_scaling") or params or None
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "default":
            return theta, None
        if kind not in ("llama3", "linear"):
            raise LoaderError(f"config.json: rope scaling {kind!r} is not supported (llama3, linear are)")
        scaling = {**scaling, "rope_type": kind}
    return theta, scaling


def hf_model_config(model_dir: str) -> ModelConfig:
    path = os.path.join(model_dir, "config.json")
    cfg = _read_json(path)
    arch = cfg.get("model_type")
    if arch not in ARCHITECTURES:
        raise LoaderError(
            f"{path}: model_type {arch!r} is not supported (strata runs {', '.join(ARCHITECTURES)})"
        )
    try:
        hidden = int(cfg["hidden_size"])
        num_heads = int(cfg["num_attention_heads"])
        num_layers = int(cfg["num_hidden_layers"])
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        family = gemma3_fields(cfg, path) if arch == "gemma3_text" else {}
        theta, scaling = (family.pop("rope_theta"), family.pop("rope_scaling")) if family else _rope(cfg)
        fields = dict(
            arch=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(cfg.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            max_position=int(cfg.get("max_position_embeddings", 4096)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=arch == "qwen3",
            rope_scaling=scaling,
            layer_windows=layer_windows(arch, cfg, num_layers, path),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            name=os.path.basename(os.path.normpath(model_dir)),
        )
        if arch in MOE_ARCHITECTURES:
            family = moe_fields(arch, cfg, num_layers, path)
        return ModelConfig(**{**fields, **family})
    except KeyError as exc:
        raise LoaderError(f"{path}: required field {exc.args[0]!r} is missing") from exc


def safetensors_files(model_dir: str) -> list[str]:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        if not shards:
            raise LoaderError(f"{index} has an empty weight_map")
        files = [os.path.join(model_dir, s) for s in shards]
    else:
        files = [os.path.join(model_dir, "model.safetensors")]
    for f in files:
        if not os.path.isfile(f):
            raise LoaderError(f"missing file: {f}")
    return files


def iter_hf_tensors(model_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (Hugging Face name, float32 tensor)."""
    for path in safetensors_files(model_dir):
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                    yield from moe_tensors(name, f.get_tensor(name).to(torch.float32))
        except LoaderError:
            raise
        except Exception as exc:
            raise LoaderError(f"{path} is not a readable safetensors file: {exc}") from exc

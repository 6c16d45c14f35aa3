"""A Hugging Face mixture-of-experts model: its config.json fields and its tensor names.

Tensors reach the model under one set of names (Qwen's), whatever the checkpoint uses:
`model.layers.{i}.mlp.gate.weight` (the router [E, hidden]),
`mlp.experts.{e}.{gate,up,down}_proj.weight`, `mlp.shared_expert.{gate,up,down}_proj.weight`
and `mlp.shared_expert_gate.weight`. Mixtral checkpoints name them `block_sparse_moe.gate`
and `block_sparse_moe.experts.{e}.w1|w3|w2` (gate, up, down); transformers 5 may store each
layer's experts stacked (`mlp.experts.gate_up_proj` [E, 2 * width, hidden] and
`mlp.experts.down_proj` [E, hidden, width]), split here into one expert's views each.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from strata.errors import LoaderError

MIXTRAL_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_MIXTRAL = re.compile(r"^(model\.layers\.\d+\.)block_sparse_moe\.(gate\.weight|experts\.(\d+)\.(w[123])\.weight)$")
_STACKED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(gate_up_proj|down_proj)$")


def moe_tensors(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) under the model's names (module docstring); other tensors pass unchanged."""
    m = _MIXTRAL.match(name)
    if m is not None:
        prefix, rest, e, proj = m.groups()
        yield (f"{prefix}mlp.gate.weight" if e is None else f"{prefix}mlp.experts.{e}.{MIXTRAL_PROJ[proj]}.weight"), tensor
        return
    m = _STACKED.match(name)
    if m is None:
        yield name, tensor
        return
    prefix, kind = m.groups()
    for e in range(tensor.shape[0]):
        if kind == "down_proj":
            yield f"{prefix}{e}.down_proj.weight", tensor[e]
        else:
            gate, up = tensor[e].chunk(2, dim=0)
            yield f"{prefix}{e}.gate_proj.weight", gate
            yield f"{prefix}{e}.up_proj.weight", up


def moe_fields(arch: str, cfg: dict, num_layers: int, path: str) -> dict:
    """ModelConfig fields of a MoE family's config.json (beyond the Llama family's)."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise LoaderError(f"{path}: hidden_act {act!r} is not supported for {arch} (strata runs silu)")
    if arch in ("qwen2_moe", "qwen3_moe") and cfg.get("use_sliding_window"):
        raise LoaderError(f"{path}: use_sliding_window is not supported for {arch}")
    if arch == "olmoe" and cfg.get("clip_qkv") is not None:
        raise LoaderError(f"{path}: clip_qkv {cfg['clip_qkv']!r} is not supported (strata runs OLMoE without it)")
    # transformers 5 writes every family's expert count as num_local_experts (Mixtral's name)
    count = "num_local_experts" if arch == "mixtral" or "num_experts" not in cfg else "num_experts"
    try:
        experts = int(cfg[count])
        width = int(cfg["moe_intermediate_size" if arch in ("qwen2_moe", "qwen3_moe") else "intermediate_size"])
        norm = arch == "mixtral" or bool(cfg.get("norm_topk_prob", False))
        k = int(cfg["num_experts_per_tok"])
    except KeyError as exc:
        raise LoaderError(f"{path}: required field {exc.args[0]!r} is missing") from exc
    if not 0 < k <= experts:
        raise LoaderError(f"{path}: num_experts_per_tok {k} must be between 1 and the {experts} experts")
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense = set(cfg.get("mlp_only_layers") or ())
    layers = tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers)) \
        if arch in ("qwen2_moe", "qwen3_moe") else (True,) * num_layers
    fields = {"num_experts": experts, "experts_per_token": k, "expert_intermediate_size": width,
              "norm_topk_prob": norm, "moe_layers": layers}
    if arch == "qwen2_moe":
        fields["shared_expert_intermediate_size"] = int(cfg.get("shared_expert_intermediate_size") or 0)
        fields["attention_bias"] = bool(cfg.get("qkv_bias", True))
    if arch == "qwen3_moe":
        fields["qk_norm"] = True
    if arch == "olmoe":
        fields["qk_norm"] = fields["qk_norm_full"] = True
    return fields

"""A mixture-of-experts GGUF file: its metadata, tensor names and stacked expert tensors.

llama.cpp writes Mixtral as `llama` with `llama.expert_count` set, and `qwen2moe`,
`qwen3moe`, `olmoe` under their own names. A MoE layer holds the router `ffn_gate_inp`
[E, hidden], the experts stacked in `ffn_gate_exps` / `ffn_up_exps` ([E, width, hidden])
and `ffn_down_exps` ([E, hidden, width]) (older Mixtral files: one `ffn_gate.{e}` tensor per
expert), and Qwen2-MoE's shared expert `ffn_{gate,up,down}_shexp` with its gate
`ffn_gate_inp_shexp` [hidden]. A layer without a router is a dense MLP. Routing as llama.cpp
runs each family: softmax gating, the top-k weights renormalised for Mixtral and Qwen3-MoE
(`<arch>.expert_weights_norm` overrides), unscaled.
"""

from __future__ import annotations

import re

from gguf import GGUFReader

from strata.errors import LoaderError
from strata.loader.gguf_file import field_value

# GGUF architecture -> ModelConfig.arch (`llama` is Mixtral when it has experts).
MOE_GGUF_ARCHES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "olmoe": "olmoe"}
# What llama.cpp renormalises when the file does not say (expert_weights_norm).
NORM_TOPK = {"mixtral": True, "qwen2_moe": False, "qwen3_moe": True, "olmoe": False}
# Mixture-of-experts architectures llama.cpp writes that strata does not run (a clear refusal).
REFUSED_MOE_ARCHES = ("deepseek", "deepseek2", "dbrx", "grok", "arctic", "phimoe", "granitemoe", "jamba",
                      "bailingmoe", "llama4", "hunyuan-moe", "ernie4_5-moe", "glm4moe", "gpt-oss", "minimax-m2")
SOFTMAX_GATING = 1  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX

# GGUF name (after "blk.{i}.") -> Hugging Face name (after "model.layers.{i}.") for MoE layers;
# "{e}" in a stacked tensor's name stands for each expert.
MOE_LAYER_NAMES = {
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.{e}.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.{e}.up_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.{e}.down_proj.weight",
    "ffn_gate_shexp.weight": "mlp.shared_expert.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_expert.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_expert.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}
_PER_EXPERT = re.compile(r"^ffn_(gate|up|down)\.(\d+)\.weight$")  # older Mixtral files
EXPERT_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")
SHARED_TENSORS = ("ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight", "ffn_gate_inp_shexp.weight")


def moe_layer_name(rest: str) -> str | None:
    """The Hugging Face name (after "model.layers.{i}.") of a MoE layer's GGUF tensor, or None."""
    if rest in MOE_LAYER_NAMES:
        return MOE_LAYER_NAMES[rest]
    m = _PER_EXPERT.match(rest)
    return None if m is None else f"mlp.experts.{m.group(2)}.{m.group(1)}_proj.weight"


def moe_arch(reader: GGUFReader, gguf_arch: str) -> str | None:
    """ModelConfig.arch of a MoE file, or None (a dense one)."""
    if gguf_arch == "llama":
        return "mixtral" if int(field_value(reader, "llama.expert_count", 0) or 0) > 0 else None
    return MOE_GGUF_ARCHES.get(gguf_arch)


def moe_config_fields(reader: GGUFReader, gguf_arch: str, arch: str, num_layers: int, path: str) -> dict:
    """ModelConfig fields of a MoE file: expert counts and widths, routing, which layers route."""
    a = gguf_arch
    names = {t.name: t for t in reader.tensors}
    experts = int(field_value(reader, f"{a}.expert_count", 0) or 0)
    k = int(field_value(reader, f"{a}.expert_used_count", 0) or 0)
    if experts < 1 or not 0 < k <= experts:
        raise LoaderError(f"{path}: GGUF metadata {a}.expert_count {experts} / {a}.expert_used_count {k} "
                          "must name at least one expert and between 1 and expert_count used per token")
    gating = int(field_value(reader, f"{a}.expert_gating_func", SOFTMAX_GATING))
    if gating != SOFTMAX_GATING:
        raise LoaderError(f"{path}: {a}.expert_gating_func {gating} is not supported (strata runs softmax gating)")
    scale = float(field_value(reader, f"{a}.expert_weights_scale", 1.0))
    if scale != 1.0:
        raise LoaderError(f"{path}: {a}.expert_weights_scale {scale} is not supported (strata runs unscaled weights)")
    shared_count = int(field_value(reader, f"{a}.expert_shared_count", 1 if arch == "qwen2_moe" else 0))
    if shared_count > 1:
        raise LoaderError(f"{path}: {a}.expert_shared_count {shared_count} is not supported (at most 1)")
    layers = tuple(f"blk.{i}.ffn_gate_inp.weight" in names for i in range(num_layers))
    if not any(layers):
        raise LoaderError(f"{path}: {a}.expert_count is {experts} but no layer has a router (ffn_gate_inp)")
    first = layers.index(True)
    width = field_value(reader, f"{a}.expert_feed_forward_length")
    if width is None:  # the stacked gate [E, width, hidden] (GGUF lists dims innermost first)
        gate = names.get(f"blk.{first}.ffn_gate_exps.weight")
        width = int(gate.shape[1]) if gate is not None else int(field_value(reader, f"{a}.feed_forward_length"))
    shared = 0
    if f"blk.{first}.ffn_gate_shexp.weight" in names:
        shared = field_value(reader, f"{a}.expert_shared_feed_forward_length")
        shared = int(shared if shared is not None else names[f"blk.{first}.ffn_gate_shexp.weight"].shape[1])
    norm = field_value(reader, f"{a}.expert_weights_norm")
    return {
        "num_experts": experts,
        "experts_per_token": k,
        "expert_intermediate_size": int(width),
        "shared_expert_intermediate_size": shared,
        "norm_topk_prob": NORM_TOPK[arch] if norm is None else bool(norm),
        "moe_layers": layers,
        "qk_norm_full": arch == "olmoe",
    }


def moe_required(cfg) -> tuple[str, ...]:
    """GGUF names (after "blk.{i}.") a MoE layer needs beyond attention and its experts: the
    router and the shared expert if any (experts: `missing_experts`)."""
    return ("ffn_gate_inp.weight",) + (SHARED_TENSORS if cfg.shared_expert_intermediate_size else ())


def missing_experts(names: set[str], cfg, i: int) -> str | None:
    """The first expert tensor layer i lacks (stacked, or one per expert), or None."""
    stacked = [f"blk.{i}.{n}" for n in EXPERT_TENSORS]
    if any(n in names for n in stacked) or f"blk.{i}.ffn_gate.0.weight" not in names:
        return next((n for n in stacked if n not in names), None)
    for e in range(cfg.num_experts):
        for proj in ("gate", "up", "down"):
            name = f"blk.{i}.ffn_{proj}.{e}.weight"
            if name not in names:
                return name
    return None

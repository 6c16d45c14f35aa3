"""The fields of a Hugging Face config.json that differ by family: sliding windows per layer
(Mistral, Qwen2/Qwen3, Gemma 3), Gemma 3's RoPE pair and query scale, and the Gemma 3
variants strata refuses by name."""

from __future__ import annotations

from strata.errors import LoaderError

# Gemma 3's sliding/global interleave when config.json has no layer_types (transformers' default).
GEMMA3_SLIDING_PATTERN = 6
GEMMA3_DEFAULTS = {"rope_theta": 1_000_000.0, "rope_local_theta": 10_000.0, "query_pre_attn_scalar": 256,
                   "head_dim": 256, "sliding_window": 4096}
LAYER_TYPES = ("full_attention", "sliding_attention")


def layer_windows(arch: str, cfg: dict, num_layers: int, path: str) -> tuple[int | None, ...]:
    """Each layer's window (None: full attention), as transformers applies them; empty when
    every layer attends fully."""
    window = cfg.get("sliding_window")
    if arch == "gemma3_text" and "sliding_window" not in cfg:
        window = GEMMA3_DEFAULTS["sliding_window"]
    if arch in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and not cfg.get("use_sliding_window", False):
        window = None  # transformers drops the window unless use_sliding_window is set
    if arch in ("llama", "olmoe") or window is None:
        return ()
    if not isinstance(window, int) or window < 1:
        raise LoaderError(f"{path}: sliding_window {window!r} is not a positive integer")
    if arch in ("mistral", "mixtral"):
        return (window,) * num_layers
    types = cfg.get("layer_types")
    if types is None and arch == "gemma3_text":
        pattern = int(cfg.get("sliding_window_pattern", GEMMA3_SLIDING_PATTERN))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    elif types is None:  # Qwen2/Qwen3: the layers from max_window_layers on slide
        first = int(cfg.get("max_window_layers", num_layers))
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    if len(types) != num_layers:
        raise LoaderError(f"{path}: layer_types names {len(types)} layers, num_hidden_layers is {num_layers}")
    for t in types:
        if t not in LAYER_TYPES:
            raise LoaderError(f"{path}: layer type {t!r} is not supported (strata runs {', '.join(LAYER_TYPES)})")
    windows = tuple(window if t == "sliding_attention" else None for t in types)
    return windows if any(w is not None for w in windows) else ()


def gemma3_fields(cfg: dict, path: str) -> dict:
    """ModelConfig fields of a `gemma3_text` config.json (transformers 4 or 5 layout)."""
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if cfg.get(key) is not None:
            raise LoaderError(f"{path}: {key} {cfg[key]!r} is not supported (strata runs Gemma 3 without it)")
    if cfg.get("use_bidirectional_attention"):
        raise LoaderError(f"{path}: use_bidirectional_attention is not supported")
    act = cfg.get("hidden_activation", cfg.get("hidden_act", "gelu_pytorch_tanh"))
    if act != "gelu_pytorch_tanh":
        raise LoaderError(f"{path}: hidden_activation {act!r} is not supported (strata runs gelu_pytorch_tanh)")
    if cfg.get("attention_bias"):
        raise LoaderError(f"{path}: attention_bias is not supported for gemma3_text")
    params = cfg.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or {})
    local = params.get("sliding_attention") or {}
    if cfg.get("rope_scaling"):
        full.update(cfg["rope_scaling"])
    theta = float(full.get("rope_theta", cfg.get("rope_theta", GEMMA3_DEFAULTS["rope_theta"])))
    local_theta = float(local.get("rope_theta", cfg.get("rope_local_base_freq", GEMMA3_DEFAULTS["rope_local_theta"])))
    if local.get("rope_type", "default") != "default":
        raise LoaderError(f"{path}: sliding-window rope scaling {local['rope_type']!r} is not supported")
    kind = full.get("rope_type", full.get("type", "default"))
    if kind not in ("default", "linear"):
        raise LoaderError(f"{path}: rope scaling {kind!r} is not supported for gemma3_text (linear is)")
    scaling = None if kind == "default" else {"rope_type": "linear", "factor": float(full["factor"])}
    return {
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rope_local_theta": local_theta,
        "query_pre_attn_scalar": float(cfg.get("query_pre_attn_scalar", GEMMA3_DEFAULTS["query_pre_attn_scalar"])),
        "head_dim": int(cfg.get("head_dim") or GEMMA3_DEFAULTS["head_dim"]),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "attention_bias": False,
        "qk_norm": True,
    }

"""The architecture-agnostic description of a model, filled by the loaders."""

from __future__ import annotations

from dataclasses import dataclass, field

# Architecture families strata runs, by Hugging Face `model_type`.
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
# The mixture-of-experts families among them (models/moe_model.py).
MOE_ARCHITECTURES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # one of ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int  # the context length the model was trained for
    tie_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # RMSNorm on each head of q and k (Qwen3)
    rope_scaling: dict | None = field(default=None, hash=False)  # HF's rope_scaling / rope_parameters
    # Each layer's window W (a token at position p reads cells max(0, p - W + 1) .. p), or None:
    # full attention. Empty: every layer attends fully.
    layer_windows: tuple[int | None, ...] = ()
    # Gemma 3: the sliding layers' own RoPE base, and the query scale query_pre_attn_scalar ** -0.5.
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    # Mixture of experts (0 experts: a dense model). A MoE layer routes each token to
    # `experts_per_token` of `num_experts` SwiGLU experts of width `expert_intermediate_size`
    # (models/moe_block.py); `moe_layers[i]`: layer i is a MoE layer (the others are dense MLPs
    # of `intermediate_size`).
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's sigmoid-gated shared expert (0: none)
    norm_topk_prob: bool = False  # the top-k router weights renormalised to sum to 1
    moe_layers: tuple[bool, ...] = ()
    qk_norm_full: bool = False  # OLMoE: q and k normed over the whole projection, not per head
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = ""

    def window(self, i: int) -> int | None:
        """Layer i's window, or None (full attention)."""
        return self.layer_windows[i] if self.layer_windows else None

    def is_moe_layer(self, i: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[i]

    def mlp_params(self, i: int) -> int:
        """Weights of layer i's MLP: its dense SwiGLU, or router, experts and shared expert."""
        h = self.hidden_size
        if not self.is_moe_layer(i):
            return 3 * h * self.intermediate_size
        shared = 3 * h * self.shared_expert_intermediate_size + h if self.shared_expert_intermediate_size else 0
        return self.num_experts * (h + 3 * h * self.expert_intermediate_size) + shared

    @property
    def windows(self) -> tuple[int, ...]:
        """The distinct windows of the layers, ascending (empty: every layer attends fully)."""
        return tuple(sorted({w for w in self.layer_windows if w is not None}))

    @property
    def kv_cells_bytes_per_token(self) -> int:
        """Bytes of K and V for one token over all layers at 2 bytes a value."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2

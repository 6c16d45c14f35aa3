"""The architecture-agnostic description of a model, filled by the loaders."""

from __future__ import annotations

from dataclasses import dataclass, field

# Architecture families strata runs, by Hugging Face `model_type`.
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")


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
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = ""

    def window(self, i: int) -> int | None:
        """Layer i's window, or None (full attention)."""
        return self.layer_windows[i] if self.layer_windows else None

    @property
    def windows(self) -> tuple[int, ...]:
        """The distinct windows of the layers, ascending (empty: every layer attends fully)."""
        return tuple(sorted({w for w in self.layer_windows if w is not None}))

    @property
    def kv_cells_bytes_per_token(self) -> int:
        """Bytes of K and V for one token over all layers at 2 bytes a value."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2

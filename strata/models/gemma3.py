"""Gemma 3 (Hugging Face `gemma3_text`, GGUF `gemma3`).

What differs from the Llama family (llama.py), whose embedding, projections, attention
and head it shares: RMSNorm scaled by (1 + weight); four norms per layer (input,
post-attention on the attention output, pre- and post-feedforward on the MLP); q/k norm
per head; the embedding scaled by sqrt(hidden) (the scale rounded to the compute dtype,
as transformers does); GeGLU with the tanh GELU; queries scaled by
query_pre_attn_scalar ** -0.5; and interleaved layers: sliding-window layers (window
`cfg.layer_windows[i]`, RoPE base `cfg.rope_local_theta`, no scaling) and global ones
(`cfg.rope_theta` with `cfg.rope_scaling`).
Weights keep their Hugging Face names; a norm weight `w` is HF's (the model adds the 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, MutableMapping, Sequence

import torch
import torch.nn.functional as F

from strata.models.attention import AttentionMeta, attend
from strata.models.config import ModelConfig
from strata.models.layers import RMSNorm, Rotary, apply_rotary, rope_inv_freq
from strata.models.linear import fused_linear
from strata.models.llama import LayerCells, LlamaModel, layer_name
from strata.models.quant import QuantWeight
from strata.models.rows import RowKinds


def gemma_norm(weight: torch.Tensor, eps: float) -> RMSNorm:
    """RMSNorm scaling by (1 + weight), the sum taken in float32 and kept in weight's dtype."""
    return RMSNorm((1.0 + weight.float()).to(weight.dtype), eps)


def gelu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gate) * up of gate_up [rows, 2 * width] (gate | up) -> [rows, width]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


class Gemma3Layer:
    def __init__(self, cfg: ModelConfig, w: MutableMapping[str, torch.Tensor | QuantWeight], i: int,
                 weight_mode: str):
        def norm(suffix: str) -> RMSNorm:
            return gemma_norm(w[layer_name(i, suffix)], cfg.rms_norm_eps)

        self.cfg = cfg
        self.input_norm = norm("input_layernorm.weight")
        self.post_attn_norm = norm("post_attention_layernorm.weight")
        self.pre_ffn_norm = norm("pre_feedforward_layernorm.weight")
        self.post_ffn_norm = norm("post_feedforward_layernorm.weight")
        self.q_norm = norm("self_attn.q_norm.weight")
        self.k_norm = norm("self_attn.k_norm.weight")
        dtype, device = self.input_norm.weight.dtype, self.input_norm.weight.device

        def linear(names: list[str]):
            return fused_linear(w, [layer_name(i, n) for n in names], None, weight_mode, dtype, device, pack=True)

        self.qkv = linear([f"self_attn.{p}_proj.weight" for p in "qkv"])
        self.o = linear(["self_attn.o_proj.weight"])
        self.gate_up = linear([f"mlp.{p}_proj.weight" for p in ("gate", "up")])
        self.down = linear(["mlp.down_proj.weight"])
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        # Attention reads scale scores by head_dim ** -0.5; queries carry the rest of the
        # model's scale query_pre_attn_scalar ** -0.5 (None: the two agree).
        scalar = cfg.query_pre_attn_scalar or cfg.head_dim
        self.q_scale = None if scalar == cfg.head_dim else (cfg.head_dim / scalar) ** 0.5

    def __call__(
        self,
        x: torch.Tensor,  # [tokens, hidden]
        cos: torch.Tensor,  # [tokens, 1, head_dim / 2] of this layer's RoPE (local or global)
        sin: torch.Tensor,
        k_cache,  # Cells [kv_heads, cells, head_dim]
        v_cache,
        meta: AttentionMeta,  # the addressing of this layer's window
        ops=None,  # the fused decode ops (norms only), or None
        kinds: RowKinds | None = None,  # which rows are decode rows (models/rows.py); None: all
    ) -> torch.Tensor:
        cfg = self.cfg
        t = x.shape[0]
        q, k, v = self.qkv(self.input_norm(x, ops), kinds).split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        q = apply_rotary(self.q_norm(q.reshape(t, cfg.num_heads, cfg.head_dim)), cos, sin)
        k = apply_rotary(self.k_norm(k.reshape(t, cfg.num_kv_heads, cfg.head_dim)), cos, sin)
        if self.q_scale is not None:
            q = q * self.q_scale
        a = attend(q, k, v.reshape(t, cfg.num_kv_heads, cfg.head_dim), k_cache, v_cache, meta)
        x = x + self.post_attn_norm(self.o(a, kinds), ops)
        h = self.post_ffn_norm(self.down(gelu_mul(self.gate_up(self.pre_ffn_norm(x, ops), kinds)), kinds),
                               ops)
        return x + h


class Gemma3Model(LlamaModel):
    """LlamaModel's construction, runtime and head with Gemma 3's layers, norms, embedding
    scale and two RoPE tables (local for sliding-window layers, global for the rest)."""

    def __init__(self, cfg: ModelConfig, weights: MutableMapping[str, torch.Tensor | QuantWeight],
                 dtype: torch.dtype, layer_devices: Sequence[torch.device], max_positions: int,
                 weight_mode: str = "dense", fused: bool = True):
        weights["model.norm.weight"] = gemma_norm(weights["model.norm.weight"], cfg.rms_norm_eps).weight
        local = dataclasses.replace(cfg, rope_theta=cfg.rope_local_theta or cfg.rope_theta, rope_scaling=None)
        self.local_inv_freq = rope_inv_freq(local)  # [head_dim / 2] float32
        # sqrt(hidden) in the compute dtype, multiplied in it
        self.embed_scale = torch.tensor(cfg.hidden_size**0.5, dtype=torch.float32).to(dtype)
        super().__init__(cfg, weights, dtype, layer_devices, max_positions, weight_mode, fused)

    def make_layer(self, cfg: ModelConfig, weights, i: int, weight_mode: str) -> Gemma3Layer:
        return Gemma3Layer(cfg, weights, i, weight_mode)

    def prepare_runtime(self, max_positions: int, fused: bool = True) -> None:
        super().prepare_runtime(max_positions, fused)
        self.local_rotary = {d: Rotary(self.local_inv_freq, max_positions, self.dtype, d) for d in self.devices}

    def __getstate__(self) -> dict:
        return {k: v for k, v in super().__getstate__().items() if k != "local_rotary"}

    def forward(
        self,
        input_ids: torch.Tensor,  # [tokens] on the first device
        positions: Mapping[torch.device, torch.Tensor],  # [tokens] per device
        metas: Mapping[torch.device, Mapping[int | None, AttentionMeta]],  # per device, per window
        kv: LayerCells,
        logits_rows: torch.Tensor,  # [rows] on the last device
        kinds: RowKinds | None = None,  # which rows are decode rows (None: all of them)
    ) -> torch.Tensor:
        """Float32 logits [rows, vocab] (as LlamaModel.forward)."""
        kinds = kinds or RowKinds.all_decode(input_ids.numel(), logits_rows.numel())
        x = self.embedding(input_ids) * self.embed_scale.to(self.layer_devices[0])
        tables = {d: self.rotary[d].tables(positions[d]) for d in self.devices}
        local = {d: self.local_rotary[d].tables(positions[d]) for d in self.devices}
        for i, layer in enumerate(self.layers):
            dev = self.layer_devices[i]
            if x.device != dev:
                x = x.to(dev, non_blocking=True)
            window = self.cfg.window(i)
            cos, sin = (tables if window is None else local)[dev]
            x = layer(x, cos, sin, *kv.layer_caches(i), metas[dev][window], self.ops, kinds)
        x = self.norm(x.index_select(0, logits_rows), self.ops)
        return self.lm_head(x, kinds).float()

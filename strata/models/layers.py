"""Model-agnostic layers: RMSNorm, rotary embedding, the token embedding (projections: linear.py).

Hot-path classes are plain objects holding tensors (no nn.Module dispatch per call).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from strata.models.config import ModelConfig
from strata.models.fused import load_quant_ops
from strata.models.quant import QuantWeight




class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight = weight  # [dim]
        self.eps = eps

    def __call__(self, x: torch.Tensor, ops=None) -> torch.Tensor:
        """x [rows, dim]; `ops`: the fused decode ops (models/fused.py) or None. Each computes a
        row by itself, but the two round differently, so one of them takes every row count: a
        prompt's last row normed in a long piece and alone then agree (models/rows.py)."""
        if ops is not None and x.dim() == 2 and x.is_contiguous():
            return ops.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor, ops=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, rms_norm(x + delta)); with `ops`, x [rows, dim] is updated in place."""
        if ops is not None and x.dim() == 2 and x.is_contiguous() and delta.is_contiguous():
            return x, ops.add_rms_norm(x, delta, self.weight, self.eps)
        x = x + delta
        return x, self(x)


def silu_mul(gate_up: torch.Tensor, ops=None) -> torch.Tensor:
    """silu(gate) * up of gate_up [rows, 2 * width] (gate | up) -> [rows, width]; `ops`: the
    fused decode ops (vectorised, torch's rounding steps) or None: torch's ops."""
    if ops is not None and gate_up.is_contiguous():
        return ops.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class Embedding:
    """Token ids -> rows [T, hidden] in the compute dtype: a dense table, or the file's
    quantized one (native) of which each step dequantises only the rows it looks up."""

    def __init__(self, weight: torch.Tensor | None, quant: QuantWeight | None, dtype: torch.dtype,
                 device: torch.device):
        assert weight is not None or quant is not None
        if weight is None and (device.type != "cpu" or load_quant_ops() is None):
            weight = quant.dequantize(dtype).to(device)
        self.weight = weight  # [vocab, hidden] or None
        self.quant = quant if weight is None else None
        self.dtype = dtype

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.weight is not None:
            return F.embedding(ids, self.weight)
        return self.quant.dequantize_rows(ids, self.dtype)


def rope_inv_freq(cfg: ModelConfig, rope_freqs: torch.Tensor | None = None) -> torch.Tensor:
    """[head_dim / 2] inverse frequencies, with llama3 or linear scaling applied."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type")
    if rope_freqs is not None:  # GGUF llama3: the per-frequency factors are stored precomputed
        inv_freq = inv_freq / rope_freqs.float()
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    elif kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    return inv_freq


class Rotary:
    """Rotary embedding in Hugging Face's rotate-half layout, tables for `max_positions`."""

    def __init__(self, inv_freq: torch.Tensor, max_positions: int, dtype: torch.dtype, device):
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(pos, inv_freq.float())  # [positions, head_dim / 2]
        self.cos = freqs.cos().to(dtype=dtype, device=device)
        self.sin = freqs.sin().to(dtype=dtype, device=device)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for `positions` [T], shaped [T, 1, head_dim / 2] to broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim] -> rotated, same shape."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

"""Model-agnostic layers: RMSNorm, rotary embedding, linear projections.

Hot-path classes are plain objects holding tensors (no nn.Module dispatch per call).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from strata.models.q4 import GROUP, Q4Weight, pack_for_cpu
from strata.models.config import ModelConfig


# The fused norms' loops are scalar per row (strata/csrc): they win where a step has few rows
# (decode, or a prompt piece beside decoding lanes: 15 vs 57 us at 8 rows, 93 vs 126 at 103,
# bf16) and only tie torch's kernels on whole prompts (454 vs 412 us at 512 rows).
FUSED_MAX_ROWS = 128


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight = weight  # [dim]
        self.eps = eps

    def __call__(self, x: torch.Tensor, ops=None) -> torch.Tensor:
        """x [rows, dim]; `ops`: the fused decode ops (models/fused.py) or None."""
        if ops is not None and x.dim() == 2 and x.shape[0] <= FUSED_MAX_ROWS and x.is_contiguous():
            return ops.rms_norm(x, self.weight, self.eps)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor, ops=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, rms_norm(x + delta)); with `ops`, x [rows, dim] is updated in place."""
        if ops is not None and x.dim() == 2 and x.shape[0] <= FUSED_MAX_ROWS and x.is_contiguous() \
                and delta.is_contiguous():
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


# Decode steps of up to this many rows use the 4-bit kernel when a projection has one;
# larger batches (prompt pieces) use the dense weight, where matrix units do better.
INT4_MAX_ROWS = 8


class Linear:
    """y = x W^T (+ b): W dense [out, in] in the compute dtype, and/or 4-bit packed (CPU).

    With both, steps of at most `INT4_MAX_ROWS` rows read the 4-bit copy (a quarter of
    the bytes), longer ones the dense weight; with only the 4-bit copy, every step uses it.
    """

    def __init__(
        self,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None = None,
        int4: tuple[torch.Tensor, torch.Tensor] | None = None,  # (packed codes, scales_and_zeros)
    ):
        assert weight is not None or int4 is not None
        self.weight = weight
        self.bias = bias
        self.int4 = int4
        self.int4_max_rows = INT4_MAX_ROWS if weight is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.int4 is not None and (self.int4_max_rows is None or x.shape[0] <= self.int4_max_rows):
            packed, scales_and_zeros = self.int4
            y = torch._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_and_zeros)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)

    @property
    def num_bytes(self) -> int:
        parts = [self.weight, self.bias] + (list(self.int4) if self.int4 else [])
        return sum(t.numel() * t.element_size() for t in parts if t is not None)


def fused_linear(
    weights: Mapping[str, torch.Tensor | Q4Weight],
    names: Sequence[str],
    bias_names: Sequence[str] | None,
    weight_mode: str,
) -> Linear:
    """One projection computing `names` side by side (q|k|v, gate|up); 4-bit where stored so."""
    dense = [weights.get(n) for n in names]
    q4 = [weights.get(n + ".q4") for n in names]
    bias = torch.cat([weights[b] for b in bias_names]) if bias_names else None
    int4 = None
    if weight_mode != "dense" and all(q is not None for q in q4) and dense[0].device.type == "cpu":
        int4 = pack_for_cpu(Q4Weight.cat(q4), dense[0].dtype)
    weight = None if int4 is not None and weight_mode == "native" else torch.cat(dense)
    return Linear(weight, bias, int4)


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

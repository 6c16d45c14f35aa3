"""GGUF 4-bit blocks (Q4_0, Q4_1) kept as codes + per-32 scales for torch's int4 kernel.

Both formats are 32-value groups of 4-bit codes q: Q4_0 is w = (q - 8) * d, Q4_1 is
w = q * d + m. Both are w = (q - 8) * scale + zero with scale = d and zero = 0 or
m + 8 d: the form torch's CPU int4 matmul takes. The codes never change; `pack_for_cpu`
hands scale and zero to the kernel in the compute dtype: float32 compute keeps them as
loaded (d is float16, m + 8 d is computed in float32), bfloat16 compute rounds them to
bfloat16's 8-bit mantissa (at most 2^-8 relative; tests/unit/test_q4.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType

GROUP = 32
Q4_TYPES = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1)


@dataclass(frozen=True)
class Q4Weight:
    codes: torch.Tensor  # [out, in] uint8 in 0..15
    scale: torch.Tensor  # [out, in / 32] float32
    zero: torch.Tensor  # [out, in / 32] float32

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    def dequantize(self) -> torch.Tensor:
        """[out, in] float32 (tests compare it with gguf's own dequantisation)."""
        out, k = self.codes.shape
        q = self.codes.view(out, k // GROUP, GROUP).float() - 8
        return (q * self.scale.unsqueeze(-1) + self.zero.unsqueeze(-1)).view(out, k)

    def rows(self, order: torch.Tensor) -> Q4Weight:
        return Q4Weight(self.codes[order], self.scale[order], self.zero[order])

    @staticmethod
    def cat(parts: list[Q4Weight]) -> Q4Weight:
        return Q4Weight(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scale", "zero")))


def q4_from_blocks(raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, int]) -> Q4Weight:
    """`raw`: the tensor's bytes as uint8 [out, bytes per row]; `shape`: (out, in)."""
    out, k = shape
    blocks = np.asarray(raw, dtype=np.uint8).reshape(out, k // GROUP, -1)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if qtype == GGMLQuantizationType.Q4_1:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        qs, zero = blocks[..., 4:], m + 8 * d
    else:
        qs, zero = blocks[..., 2:], np.zeros_like(d)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(out, k)  # low nibbles first
    return Q4Weight(torch.from_numpy(codes.copy()), torch.from_numpy(d), torch.from_numpy(zero))


def pack_for_cpu(w: Q4Weight, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed codes, scales_and_zeros [in / 32, out, 2]) for torch._weight_int4pack_mm_for_cpu."""
    packed = torch._convert_weight_to_int4pack_for_cpu(w.codes.to(torch.int32), 1)
    scales_and_zeros = torch.stack([w.scale, w.zero], dim=-1).transpose(0, 1).contiguous().to(dtype)
    return packed, scales_and_zeros

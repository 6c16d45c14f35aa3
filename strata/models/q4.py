"""GGUF 4-bit blocks (Q4_0, Q4_1, Q4_K) as codes + per-32 scales for torch's int4 kernel.

All three are 32-value groups of 4-bit codes q: Q4_0 is w = (q - 8) * d, Q4_1 is
w = q * d + m, Q4_K (groups of a 256-value block) is w = q * d sc - dmin mn. Each is
w = (q - 8) * scale + zero with scale = d (d sc) and zero = 0, m + 8 d or 8 d sc - dmin mn:
the form torch's CPU int4 matmul takes. The codes never change; `pack_for_cpu` hands scale
and zero to the kernel in the compute dtype: float32 compute keeps them as loaded (d is
float16, zero is computed in float32), bfloat16 compute rounds them to bfloat16's 8-bit
mantissa (at most 2^-8 relative; tests/unit/test_q4.py). `--weights auto` in bfloat16 reads
Q4_0/Q4_1 decode rows through strata's x8 kernel (q4x8.py) by default, through this form
with $STRATA_Q4_KERNEL=int4; every other case reads the blocks in place (quant.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType

GROUP = 32
Q4_TYPES = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_K)


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
    if qtype == GGMLQuantizationType.Q4_K:
        return _q4k(np.asarray(raw, dtype=np.uint8).reshape(out, k // 256, 144), shape)
    blocks = np.asarray(raw, dtype=np.uint8).reshape(out, k // GROUP, -1)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if qtype == GGMLQuantizationType.Q4_1:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        qs, zero = blocks[..., 4:], m + 8 * d
    else:
        qs, zero = blocks[..., 2:], np.zeros_like(d)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(out, k)  # low nibbles first
    return Q4Weight(torch.from_numpy(codes.copy()), torch.from_numpy(d), torch.from_numpy(zero))


def _q4k(blocks: np.ndarray, shape: tuple[int, int]) -> Q4Weight:
    """Q4_K blocks [out, k / 256, 144]: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of
    codes (group 2c: low nibbles of qs[32c:32c + 32], group 2c + 1: their high nibbles)."""
    from gguf.quants import Q4_K

    out, k = shape
    n = out * (k // 256)
    flat = blocks.reshape(n, 144)
    d = flat[:, 0:2].copy().view(np.float16).astype(np.float32)  # [n, 1]
    dmin = flat[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, mn = Q4_K.get_scale_min(flat[:, 4:16].copy())  # [n, 8] each
    scale = d * sc.astype(np.float32)
    zero = 8 * scale - dmin * mn.astype(np.float32)
    qs = flat[:, 16:].reshape(n, 4, 1, 32)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(out, k)
    return Q4Weight(torch.from_numpy(codes.copy()), torch.from_numpy(scale.reshape(out, k // GROUP)),
                    torch.from_numpy(zero.reshape(out, k // GROUP)))


def pack_for_cpu(w: Q4Weight, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed codes, scales_and_zeros [in / 32, out, 2]) for torch._weight_int4pack_mm_for_cpu."""
    packed = torch._convert_weight_to_int4pack_for_cpu(w.codes.to(torch.int32), 1)
    scales_and_zeros = torch.stack([w.scale, w.zero], dim=-1).transpose(0, 1).contiguous().to(dtype)
    return packed, scales_and_zeros

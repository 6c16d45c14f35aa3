"""Q4_0 / Q4_1 blocks with eight output columns interleaved, for strata's x8 kernel.

strata/csrc/quant_x8.inc multiplies quantized activation rows (15 or 8 bits per value, one
scale per 32) by 4-bit weights laid out so that
one integer lane is one output column: a block's float work (int32 to float, the scales,
the offset term) is shared by 8 columns, and no horizontal sums are needed. For a group of
8 columns, each 32-value block b is one 160-byte record:

    d[8] float16 | c[8] float16 | V_0 .. V_3 (32 bytes each)

with w = d u + c for column j's codes u (Q4_1: c = m; Q4_0: c = -8 d, exact in float16: a
power-of-two multiple), and bytes 4j .. 4j + 3 of V_i column j's qs[4i .. 4i + 3] (GGML's
nibble order: low nibbles are values 4i .. 4i + 3, high ones 16 + 4i .. 16 + 4i + 3). Every
byte is the file's own, moved: 20 bytes per column and block, Q4_1's size (Q4_0's 18 plus
its c). A last group of fewer than 8 columns is padded with zero columns, never read out.
Parts of one projection (q|k|v, gate|up) may mix Q4_0 and Q4_1: they pack into one form.

Q8_0 weights (the default model's head) and Q5_0 ones (w = d (q - 16)) pack the same way with
8-bit codes, the q8x8 form: a 272-byte record per block and group, d[8] float16 | U_0 .. U_7
(32 bytes each), bytes 4j .. 4j + 3 of U_t column j's signed codes 4t .. 4t + 3 plus 128 (u in
[0, 255]; w = d u - 128 d, the kernel forms c = -128 d). 34 bytes per column and block: Q8_0's
own size, Q5_0's 22 widened; the values are the file's.

Q5_0 weights alone (no Q8_0 part) pack into the q5x8 form, Q5_0's own 22 bytes per column and
block: a 176-byte record d[8] float16 | V_0 .. V_3 (the low 4 bits, as the x8 form's nibbles) |
H (32 bytes: bit t of byte 4j + b is column j's fifth bit of value 4t + b, Q5_0's qh bit 4t + b).
u = nibble + 16 fifth bit in [0, 31], w = d u - 16 d (the kernel forms c = -16 d).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from strata.models.fused import load_quant_ops
from strata.models.quant import QuantWeight

X8_TYPES = (QT.Q4_0, QT.Q4_1)
Q8X8_TYPES = (QT.Q8_0, QT.Q5_0)  # w = d * code, |code| <= 128: the q8x8 form's values
RECORD = 160  # bytes per block and group of 8 columns (quant.h: X8_RECORD_BYTES)
Q5_RECORD = 176  # the same for the q5x8 form (quant.h: X8Q5_RECORD_BYTES)
Q8_RECORD = 272  # the same for the q8x8 form (quant.h: X8Q8_RECORD_BYTES)


def x8_form(qtypes) -> str | None:
    """The x8 form a bfloat16 projection fused from parts of `qtypes` reads at decode rows:
    "q5x8" for Q5_0 alone (its own 22 bytes a block and column), "q8x8" for Q8_0 or Q5_0 beside
    Q8_0 (a Q5_0 block widened to 34), None for any other type (or a missing part: None)."""
    if not qtypes or not all(t in Q8X8_TYPES for t in qtypes):
        return None
    return "q5x8" if all(t == QT.Q5_0 for t in qtypes) else "q8x8"


def _fields(w: QuantWeight) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d, c) float16 [out, blocks] and qs uint8 [out, blocks, 16] of a Q4_0 or Q4_1 weight."""
    blocks = w.raw.numpy().reshape(w.out_features, w.in_features // 32, -1)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if w.qtype == QT.Q4_1:
        return d, blocks[..., 2:4].copy().view(np.float16)[..., 0], blocks[..., 4:20]
    return d, d * np.float16(-8), blocks[..., 2:18]


def _records(scales: list[np.ndarray], codes: np.ndarray) -> torch.Tensor:
    """uint8 [ceil(out / 8), blocks * record]: per block and group of 8 columns, each of `scales`
    (float16 [out, blocks]) as the 8 columns' values, then `codes` (uint8 [out, blocks, 4 w]) as
    w words of 4 bytes with the 8 columns side by side in each; a last group of fewer than 8
    columns padded with zero columns (scale 0)."""
    out, nb, width = codes.shape
    pad = -out % 8
    if pad:
        scales = [np.concatenate([a, np.zeros((pad, nb), np.float16)]) for a in scales]
        codes = np.concatenate([codes, np.zeros((pad, nb, width), np.uint8)])
    groups = (out + pad) // 8
    parts = [a.reshape(groups, 8, nb).transpose(0, 2, 1).copy().view(np.uint8) for a in scales]  # [G, nb, 16]
    # codes [G, 8 columns, nb, w words, 4 bytes] -> [G, nb, word, column, byte]
    parts.append(codes.reshape(groups, 8, nb, width // 4, 4).transpose(0, 2, 3, 1, 4).reshape(groups, nb, 8 * width))
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(parts, axis=2).reshape(groups, -1)))


def pack_x8(parts: list[QuantWeight]) -> torch.Tensor:
    """uint8 [ceil(out / 8), in / 32 * 160]: `parts` (Q4_0/Q4_1, same in) side by side, x8 form."""
    if not parts or any(p.qtype not in X8_TYPES for p in parts) or parts[0].in_features % 32:
        raise ValueError("pack_x8: Q4_0/Q4_1 parts with inputs a multiple of 32")
    fields = [_fields(p) for p in parts]
    d, c, qs = (np.concatenate([f[i] for f in fields]) for i in range(3))
    return _records([d, c], qs)


def unpack_x8(packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """[out, in] float32: the weights the x8 form holds (tests; gguf-py's values for its parts)."""
    groups, width = packed.shape
    nb = width // RECORD
    rec = packed.numpy().reshape(groups, nb, RECORD)
    d = rec[..., 0:16].copy().view(np.float16).astype(np.float32)  # [G, nb, 8]
    c = rec[..., 16:32].copy().view(np.float16).astype(np.float32)
    v = rec[..., 32:].reshape(groups, nb, 4, 8, 4)  # [G, nb, i, column, byte]
    u = np.concatenate([v & 0x0F, v >> 4], axis=2).astype(np.float32)  # [G, nb, 8 words t, column, byte]
    w = u * d[:, :, None, :, None] + c[:, :, None, :, None]
    w = w.transpose(0, 3, 1, 2, 4).reshape(groups * 8, nb * 32)  # value 4t + byte of block b
    return torch.from_numpy(np.ascontiguousarray(w[:out_features]))


def _signed_codes(w: QuantWeight) -> tuple[np.ndarray, np.ndarray]:
    """(d float16 [out, blocks], codes int16 [out, blocks, 32]) with w = d * code: Q8_0's int8
    codes, or Q5_0's 5-bit q - 16 (GGML's order: value i's low nibble in qs[i % 16], low half
    for i < 16, its fifth bit bit i of qh)."""
    blocks = w.raw.numpy().reshape(w.out_features, w.in_features // 32, -1)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if w.qtype == QT.Q8_0:
        return d, blocks[..., 2:34].view(np.int8).astype(np.int16)
    qh = blocks[..., 2:6].copy().view(np.uint32)[..., 0]  # [out, blocks]
    qs = blocks[..., 6:22]
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int16)  # [out, blocks, 32]
    high = ((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int16)
    return d, low + 16 * high - 16


def pack_q8x8(parts: list[QuantWeight]) -> torch.Tensor:
    """uint8 [ceil(out / 8), in / 32 * 272]: `parts` (Q8_0/Q5_0, same in) side by side, q8x8 form."""
    if not parts or any(p.qtype not in Q8X8_TYPES for p in parts) or parts[0].in_features % 32:
        raise ValueError("pack_q8x8: Q8_0/Q5_0 parts with inputs a multiple of 32")
    fields = [_signed_codes(p) for p in parts]
    d, codes = (np.concatenate([f[i] for f in fields]) for i in range(2))
    return _records([d], (codes + 128).astype(np.uint8))


def pack_q5x8(parts: list[QuantWeight]) -> torch.Tensor:
    """uint8 [ceil(out / 8), in / 32 * 176]: `parts` (Q5_0, same in) side by side, q5x8 form."""
    if not parts or any(p.qtype != QT.Q5_0 for p in parts) or parts[0].in_features % 32:
        raise ValueError("pack_q5x8: Q5_0 parts with inputs a multiple of 32")
    blocks = [p.raw.numpy().reshape(p.out_features, p.in_features // 32, 22) for p in parts]
    d = np.concatenate([b[..., 0:2].copy().view(np.float16)[..., 0] for b in blocks])  # [out, blocks]
    qh = np.concatenate([b[..., 2:6].copy().view(np.uint32)[..., 0] for b in blocks])
    qs = np.concatenate([b[..., 6:22] for b in blocks])  # [out, blocks, 16]
    value = 4 * np.arange(8, dtype=np.uint32)[:, None] + np.arange(4, dtype=np.uint32)  # [t, b]: 4t + b
    bits = (qh[..., None, None] >> value) & 1  # [out, blocks, t, b]
    h = (bits << np.arange(8, dtype=np.uint32)[:, None]).sum(axis=2).astype(np.uint8)  # [out, blocks, b]
    return _records([d], np.concatenate([qs, h], axis=2))


def unpack_q5x8(packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """[out, in] float32: the weights the q5x8 form holds (tests)."""
    groups, width = packed.shape
    nb = width // Q5_RECORD
    rec = packed.numpy().reshape(groups, nb, Q5_RECORD)
    d = rec[..., 0:16].copy().view(np.float16).astype(np.float32)  # [G, nb, 8]
    v = rec[..., 16:144].reshape(groups, nb, 4, 8, 4)  # [G, nb, i, column, byte]
    h = rec[..., 144:].reshape(groups, nb, 1, 8, 4)  # [G, nb, 1, column, byte]
    nibbles = np.concatenate([v & 0x0F, v >> 4], axis=2)  # [G, nb, t, column, byte]
    fifth = (h >> np.arange(8, dtype=np.uint8)[:, None, None]) & 1  # bit t for word t
    w = (nibbles + 16 * fifth).astype(np.float32) * d[:, :, None, :, None] - 16 * d[:, :, None, :, None]
    w = w.transpose(0, 3, 1, 2, 4).reshape(groups * 8, nb * 32)
    return torch.from_numpy(np.ascontiguousarray(w[:out_features]))


def unpack_q8x8(packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """[out, in] float32: the weights the q8x8 form holds (tests)."""
    groups, width = packed.shape
    nb = width // Q8_RECORD
    rec = packed.numpy().reshape(groups, nb, Q8_RECORD)
    d = rec[..., 0:16].copy().view(np.float16).astype(np.float32)  # [G, nb, 8]
    u = rec[..., 16:].reshape(groups, nb, 8, 8, 4).astype(np.float32)  # [G, nb, t, column, byte]
    w = (u - 128) * d[:, :, None, :, None]
    w = w.transpose(0, 3, 1, 2, 4).reshape(groups * 8, nb * 32)
    return torch.from_numpy(np.ascontiguousarray(w[:out_features]))


ACT_BITS = (8, 15)  # the kernel's activation codes per value, one scale per 32-value block


@dataclass
class X8Matmul:
    """x [rows, in] (float32 or bfloat16) -> [rows, out] in x's dtype through the x8 kernel.

    `act_bits` 15: activations as 15-bit codes per 32-value block (two bytes, 128 q + ql: two
    byte dot products each); 8: 8-bit codes (QuantMatmul's bfloat16 path: one byte dot product,
    coarser). The integer sums are exact either way."""

    packed: torch.Tensor  # uint8 [ceil(out / 8), in / 32 * RECORD (Q5_RECORD, Q8_RECORD: weight_bits 5, 8)]
    out_features: int
    in_features: int
    act_bits: int = 15
    weight_bits: int = 4  # 4: the x8 form of Q4_0/Q4_1; 5: the q5x8 form of Q5_0; 8: the q8x8 form

    def __post_init__(self) -> None:
        if self.act_bits not in ACT_BITS:
            raise ValueError(f"X8Matmul: act_bits one of {ACT_BITS}, got {self.act_bits}")
        ops = load_quant_ops()
        if ops is None:
            raise RuntimeError("strata's quantized kernels are not built (strata/_decode_ops)")
        self._kernel = ops.Quant4x8Linear(self.packed, self.out_features, self.in_features, self.act_bits,
                                          self.weight_bits)

    @staticmethod
    def from_parts(parts: list[QuantWeight], act_bits: int = 15) -> X8Matmul:
        return X8Matmul(pack_x8(parts), sum(p.out_features for p in parts), parts[0].in_features, act_bits)

    @staticmethod
    def from_q5x8_parts(parts: list[QuantWeight], act_bits: int = 15) -> X8Matmul:
        return X8Matmul(pack_q5x8(parts), sum(p.out_features for p in parts), parts[0].in_features, act_bits,
                        weight_bits=5)

    @staticmethod
    def from_q8x8_parts(parts: list[QuantWeight], act_bits: int = 15) -> X8Matmul:
        return X8Matmul(pack_q8x8(parts), sum(p.out_features for p in parts), parts[0].in_features, act_bits,
                        weight_bits=8)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._kernel(x.contiguous())

    @property
    def num_bytes(self) -> int:
        return self.packed.numel()

    def __getstate__(self) -> dict:
        """Pickled as its packed bytes (the prepared-model cache); the kernel is rebound on load."""
        return {"packed": self.packed, "out_features": self.out_features, "in_features": self.in_features,
                "act_bits": self.act_bits, "weight_bits": self.weight_bits}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()

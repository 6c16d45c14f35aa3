"""The LM head: hidden states -> vocabulary logits, optionally read as int8 at decode.

At one to a few rows a decode step's head is a matrix-vector product bound by the bytes
of the weight ([vocab, hidden], 56.6 MB in bf16 for the default model: about a quarter of
its step). `Int8Head` keeps a per-row symmetric int8 copy (w ~= q * scale, q in
[-127, 127], scale = max|w_row| / 127) and reads it for steps of at most `max_rows` rows,
where torch's int8 CPU kernel is faster; longer steps (prompt pieces, many lanes) read the
dense weight, so prefill logits are unchanged. Quality is measured, not assumed:
`benchmarks/head_quality.py` reports top-1 agreement with the dense head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Steps of at most this many rows read the int8 copy. torch 2.13 on a 2-thread Sapphire
# Rapids, default model's head: 1 row 1.3 ms vs 3.1 ms bf16; 4 rows 2.3 vs 3.3; 8 rows
# 5.0 vs 3.2 (the int8 kernel's cost grows with rows, the dense one's barely does).
INT8_HEAD_MAX_ROWS = 4


@dataclass(frozen=True)
class Int8Rows:
    codes: torch.Tensor  # [vocab, hidden] int8
    scale: torch.Tensor  # [vocab] in the compute dtype

    @staticmethod
    def quantize(weight: torch.Tensor) -> Int8Rows:
        """Per-row symmetric int8 of `weight` [vocab, hidden] (any float dtype)."""
        w = weight.float()
        # The scale the kernel will use (rounded to the weight's dtype) is the one the codes are
        # rounded against, so every value is within half a step of q * scale.
        scale = (w.abs().amax(dim=1) / 127).to(weight.dtype).float().clamp_min(torch.finfo(torch.float32).tiny)
        codes = torch.round(w / scale.unsqueeze(1)).clamp_(-127, 127).to(torch.int8)
        return Int8Rows(codes, scale.to(weight.dtype))

    def dequantize(self) -> torch.Tensor:
        """[vocab, hidden] float32 (what the int8 kernel multiplies by)."""
        return self.codes.float() * self.scale.float().unsqueeze(1)


class DenseHead:
    def __init__(self, weight: torch.Tensor):
        self.weight = weight  # [vocab, hidden] in the compute dtype (the embedding when tied)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, hidden] -> [rows, vocab] in the compute dtype."""
        return F.linear(x, self.weight)


class Int8Head(DenseHead):
    """The dense weight for long steps, its int8 copy for steps of <= `max_rows` rows (CPU only)."""

    def __init__(self, weight: torch.Tensor, max_rows: int = INT8_HEAD_MAX_ROWS):
        super().__init__(weight)
        assert weight.device.type == "cpu", "torch's int8 weight kernel is CPU-only"
        self.int8 = Int8Rows.quantize(weight)
        self.max_rows = max_rows

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= self.max_rows:
            return torch._weight_int8pack_mm(x, self.int8.codes, self.int8.scale)
        return F.linear(x, self.weight)


def make_head(weight: torch.Tensor, weight_mode: str) -> DenseHead:
    """int8 at decode when the weights are kept quantised (`--weights auto|native`), the
    compute dtype is bfloat16 and the head is on the CPU; dense otherwise (float32 stays exact)."""
    if weight_mode != "dense" and weight.dtype == torch.bfloat16 and weight.device.type == "cpu":
        return Int8Head(weight)
    return DenseHead(weight)

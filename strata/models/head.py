"""The LM head: hidden states -> vocabulary logits, optionally read as int8 at decode.

At one to a few rows a decode step's head is a matrix-vector product bound by the bytes
of the weight ([vocab, hidden], 56.6 MB in bf16 for the default model: about a quarter of
its step). `Int8Head` keeps a per-row symmetric int8 copy (w ~= q * scale, q in
[-127, 127], scale = max|w_row| / 127) and reads it for steps of at most `max_rows` rows,
where torch's int8 CPU kernel is faster; `X8Head` reads a Q8_0 head's own values in the x8
kernel's 8-bit form (models/q4x8.py) wherever strata's quantized kernels run. A prompt's
sampling row reads the small form as decode rows do (models/rows.py), whether or not its
prefix was cached; other prompt rows (logits of every prompt row) and longer steps read the
dense weight.
Quality is measured, not assumed: `benchmarks/head_quality.py` reports top-1 agreement with
the dense head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf import GGMLQuantizationType as QT

from strata.config import head_kernel_from_env
from strata.models.fused import load_quant_ops
from strata.models.q4x8 import X8Matmul
from strata.models.quant import QuantMatmul, QuantWeight
from strata.models.rows import RowKinds, dense_rows, linear, small_rows

# Steps of at most this many rows read the int8 copy. torch 2.13 on a 2-thread Sapphire
# Rapids, default model's head: 1 row 1.3 ms vs 3.1 ms bf16; 4 rows 2.3 vs 3.3; 8 rows
# 5.0 vs 3.2 (the int8 kernel's cost grows with rows, the dense one's barely does).
INT8_HEAD_MAX_ROWS = 4
# float32 decode steps of at most this many rows read a quantized head in place beside its
# dense copy (--weights auto; benchmarks/quant_kernels.py --head).
QUANT_HEAD_MAX_ROWS = 8
# bfloat16 decode steps of at most this many rows read it in place where `head_kernel()` is
# "quant", or read the q8x8 form where torch runs AVX2 only (the row counts
# benchmarks/quant_kernels.py --head measures).
BF16_QUANT_HEAD_MAX_ROWS = 64
# bfloat16 decode steps of at most this many rows read a Q8_0 head's q8x8 form where
# `head_kernel()` is "x8" and torch runs AVX-512; longer steps read the dense weight, faster
# there on AVX-512 VNNI without AMX (benchmarks/quant_kernels.py --head).
X8_HEAD_MAX_ROWS = 16
# The q8x8 head's activation codes: 8 bits per value, one scale per 32 values (the form the
# file's Q8_0 blocks are read with in place, QuantHead, and llama.cpp's head). At 8 rows the
# kernel's integer work is half the 15-bit form's; top-1 and mean |logit difference| against
# transformers stay within tests/model/test_serving_accuracy.py's bounds (docs/benchmarks.md).
X8_HEAD_ACT_BITS = 8


def head_kernel() -> str:
    """How --weights auto reads the head at bfloat16 decode rows: "x8" (a Q8_0 head's q8x8 form,
    strata's x8 kernel), "quant" (the file's blocks, strata's kernel) or "int8" (torch's int8
    kernel). `$STRATA_HEAD_KERNEL` (config.py) forces one; else "x8" wherever strata's quantized
    kernels run, AVX-512 VNNI, AVX-VNNI or AVX2 (benchmarks/quant_kernels.py --head: with 8-bit
    activations the AVX2 variant beats the file's blocks at every row count measured), and a
    head of another type reads what `without_x8()` says."""
    choice = head_kernel_from_env()
    if choice != "auto":
        return choice
    return "x8" if load_quant_ops() is not None else without_x8()


def without_x8() -> str:
    """The auto choice for a head the q8x8 form cannot hold: "quant" where torch's CPU kernels
    run their AVX2 path (its int8 and bf16 kernels convert in software), else "int8"."""
    return "quant" if torch.backends.cpu.get_cpu_capability() == "AVX2" else "int8"


def x8_head_max_rows() -> int:
    """Decode rows up to which the q8x8 head is read: where torch runs AVX-512 the dense head
    beyond (in a step the dense head, bfloat16, twice the q8x8 form's bytes, streams from memory,
    and AMX's flat cost in rows does not make up for that at 8 lanes: benchmarks/step_profile.py,
    an 8-lane step 22.8 -> 19.1 ms on a Sapphire Rapids-class guest); where torch runs AVX2 only
    (its bf16 GEMM converts in software) as far as the file's blocks were read there."""
    if torch.backends.cpu.get_cpu_capability() == "AVX2":
        return BF16_QUANT_HEAD_MAX_ROWS
    return X8_HEAD_MAX_ROWS


@dataclass(frozen=True)
class Int8Rows:
    codes: torch.Tensor  # [vocab, hidden] int8
    scale: torch.Tensor  # [vocab] in the compute dtype

    @staticmethod
    def quantize(weight: torch.Tensor, chunk: int = 4096) -> Int8Rows:
        """Per-row symmetric int8 of `weight` [vocab, hidden] (any float dtype), `chunk` rows at a
        time (the float32 temporaries of a whole vocabulary would be 3x its bfloat16 size)."""
        codes = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
        scales = torch.empty(weight.shape[0], dtype=weight.dtype, device=weight.device)
        for start in range(0, weight.shape[0], chunk):
            w = weight[start:start + chunk].float()
            # The scale the kernel will use (rounded to the weight's dtype) is the one the codes are
            # rounded against, so every value is within half a step of q * scale.
            scale = (w.abs().amax(dim=1) / 127).to(weight.dtype).float().clamp_min(torch.finfo(torch.float32).tiny)
            codes[start:start + chunk] = torch.round(w / scale.unsqueeze(1)).clamp_(-127, 127).to(torch.int8)
            scales[start:start + chunk] = scale.to(weight.dtype)
        return Int8Rows(codes, scales)

    def dequantize(self) -> torch.Tensor:
        """[vocab, hidden] float32 (what the int8 kernel multiplies by)."""
        return self.codes.float() * self.scale.float().unsqueeze(1)


class DenseHead:
    max_rows: int | None = None  # decode rows up to which a subclass reads its small form

    def __init__(self, weight: torch.Tensor):
        self.weight = weight  # [vocab, hidden] in the compute dtype (the embedding when tied)

    def __call__(self, x: torch.Tensor, kinds: RowKinds | None = None) -> torch.Tensor:
        """x [rows, hidden] -> [rows, vocab] in the compute dtype; `kinds`: which rows are decode
        rows' (None: all of them). A subclass reads its small form for the decode rows when
        there are at most `max_rows` of them, and for prompt rows that sample (`alone_logits`);
        other prompt rows read the dense weight."""
        if self.weight is None:
            return self.small(x)
        d = x.shape[0] if kinds is None else kinds.decode_logits
        alone = range(d, x.shape[0]) if kinds is not None and kinds.alone_logits else ()
        if self.max_rows is None:
            return dense_rows(x, self.weight, None, alone)
        return small_rows(x, self.small, self._dense, d if d <= self.max_rows else 0, alone)

    def _dense(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)

    def small(self, x: torch.Tensor) -> torch.Tensor:
        return self._dense(x)


class Int8Head(DenseHead):
    """The dense weight for prompt rows and long steps, its int8 copy for steps of <= `max_rows`
    decode rows (CPU only)."""

    def __init__(self, weight: torch.Tensor, max_rows: int = INT8_HEAD_MAX_ROWS):
        super().__init__(weight)
        assert weight.device.type == "cpu", "torch's int8 weight kernel is CPU-only"
        self.int8 = Int8Rows.quantize(weight)
        self.max_rows = max_rows

    def small(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, self.int8.codes, self.int8.scale)


class X8Head(DenseHead):
    """The file's Q8_0 head in the q8x8 form (models/q4x8.py: strata's x8 kernel, 8 vocabulary
    rows per integer lane group, X8_HEAD_ACT_BITS-bit activations) for steps of at most `max_rows` decode
    rows: the file's exact values, each read once per step; the dense weight otherwise."""

    def __init__(self, x8: X8Matmul, weight: torch.Tensor, max_rows: int):
        super().__init__(weight)
        self.x8 = x8
        self.max_rows = max_rows

    def small(self, x: torch.Tensor) -> torch.Tensor:
        return self.x8(x)


class QuantHead(DenseHead):
    """The file's quantized head (the embedding when tied) read in place (models/quant.py): at
    every step without a dense weight (native), else for steps of at most `max_rows` decode rows."""

    def __init__(self, quant: QuantMatmul, weight: torch.Tensor | None, max_rows: int | None = None):
        super().__init__(weight)
        self.quant = quant
        self.max_rows = max_rows

    def small(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant(x)


def make_head(weight: torch.Tensor | None, quant: QuantWeight | None, weight_mode: str, dtype: torch.dtype,
              device: torch.device) -> DenseHead:
    """`weight`: [vocab, hidden] in the compute dtype on `device`, or None (native: only `quant`,
    the file's blocks). native reads `quant` in place at every step. auto in bfloat16 reads the
    int8 copy at decode steps (torch's int8 kernel against the default model's Q8_0 blocks in
    place, one thread: a tie at 1 row, 6.3 against 7.5 ms at 4; benchmarks/quant_kernels.py
    --head), or `quant` in place, or a Q8_0 head's q8x8 form (other types: the int8 copy),
    where `head_kernel()` says so; auto in float32 reads `quant` in place at steps of up to QUANT_HEAD_MAX_ROWS rows
    (the dense weight's exact values against float32 activations: a tie at 1 row, 11.7 against
    20.2 ms at 4, 18.9 against 32.4 at 8). dense reads the dense weight."""
    in_place = (quant is not None and device.type == "cpu" and weight_mode != "dense"
                and load_quant_ops() is not None)
    if in_place and weight_mode == "native":
        return QuantHead(QuantMatmul([quant]), None)
    if weight is None:
        weight = quant.dequantize(dtype).to(device)
    if weight_mode == "dense" or device.type != "cpu":
        return DenseHead(weight)
    if dtype == torch.bfloat16:
        kernel = head_kernel()
        if in_place and kernel == "x8" and quant.qtype == QT.Q8_0:
            return X8Head(X8Matmul.from_q8x8_parts([quant], X8_HEAD_ACT_BITS), weight, x8_head_max_rows())
        if kernel == "x8" and head_kernel_from_env() == "auto":  # not Q8_0: auto's other choice
            kernel = without_x8()  # (a forced x8 reads the int8 copy then, docs/flags.md)
        if in_place and kernel == "quant":
            return QuantHead(QuantMatmul([quant]), weight, BF16_QUANT_HEAD_MAX_ROWS)
        return Int8Head(weight)
    if in_place:
        return QuantHead(QuantMatmul([quant]), weight, QUANT_HEAD_MAX_ROWS)
    return DenseHead(weight)

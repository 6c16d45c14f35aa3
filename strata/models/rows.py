"""Which rows of a step are decode rows and which are prompt rows, and how prompt rows are read.

A step's token rows are in row order: decoding lanes' rows first (their pending tokens and
drafts), then prompt pieces (runner/inputs.py). Projections and the head choose their path
by a row's kind (models/linear.py, models/head.py): decode rows may read a 4-bit or int8
form, prompt rows read the dense weights (but for the row that samples, below), so a
prompt's tokens take one path whether or not a prefix of it was cached and whatever lanes
decode beside it.

A prompt row that samples (a prompt's last token) is computed as it would be alone, so a
retry whose prefix is cached (a piece of that one row) computes it bit-identically to the
cold prompt (the last row of a long piece), and the same chat sent twice at temperature 0
answers the same, every token:
- every projection and the head read it as they read decode rows (`alone`, here; `small_rows`):
  through the quantized form where the layer has one beside its dense weight (--weights auto),
  whose kernels compute each row by itself, so the row is the same whatever rows share the
  call (the step's decode rows, at any count); this streams only the small form's bytes, which
  the decode rows beside it stream anyway. Where the layer has only a dense weight, the dense
  weight multiplies the row on its own: a dense GEMM's rows are not bit-identical across row
  counts (the library picks its kernel by the count). Where the dense GEMM's rows are
  (`rows_alike`: strata's AMX kernel), the row is a prompt row like the others, read dense
  within its piece: a retry's one-row piece reads it dense too, bit for bit the same;
- it attends as one query over all its cells, summed in position order whatever the lane's
  layout, not within its piece's causal attention (SDPA's blocks depend on the piece's rows):
  with the fused decode kernel every row of a piece it reads reads so (runner/inputs.py
  `spans_read_piece`: up to SPANS_MAX_PROMPT_ROWS rows, fewer rows x cells where SDPA runs on AMX,
  up to SPANS_MAX_ROWS_BESIDE_PROMPT_KERNEL rows where strata's AMX prompt attention reads the
  longer pieces; `_spans_read`), else the sampling row is read again alone
  (`_sample_read`, models/attention.py `AttentionMeta.samples`);
- the norms (models/layers.py), the rotation and K/V write, and the MLP's activation compute
  each row by itself, by one kernel at any row count (the fused norm and torch's round
  differently: the fused one, where loaded, takes every step).
Decode steps after it then read the same cells at the same positions. Through the ring
(runner/ring_reads.py) a piece the decode kernel reads (`spans_read_piece`) that follows the step's
decode rows is read the same way; a longer piece there, and sliding-window layers cut to their
window (runner/windows.py), attend within the piece, equal within rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata.models.packed import PackedWeight, cpu_bf16_gemm


@dataclass(frozen=True)
class RowKinds:
    decode: int  # token rows [0, decode) are decode rows, the rest prompt rows
    decode_logits: int  # logits rows [0, decode_logits) are decode rows' (logits rows keep row order)
    alone: tuple[int, ...] = ()  # prompt token rows that sample, ascending: each multiplied on its own
    alone_logits: bool = False  # every prompt logits row is a sampling row: each multiplied on its own

    @staticmethod
    def all_decode(num_rows: int, num_logits: int) -> RowKinds:
        return RowKinds(num_rows, num_logits)


# bfloat16 GEMMs of at least this many rows run in float32 where the CPU has no bfloat16 dot
# products (`bf16_gemm_in_f32`).
F32_GEMM_MIN_ROWS = 16


def bf16_gemm_in_f32(x: torch.Tensor) -> bool:
    """Whether `linear` runs x's bfloat16 GEMM on float32 copies: a CPU step of at least
    F32_GEMM_MIN_ROWS rows where the CPU has neither AVX-512 BF16 nor AMX, so that torch's
    bfloat16 GEMM converts in software; the float32 one, its weight converted each call, is
    several times faster there from that row count (benchmarks/prefill_profile.py)."""
    return (x.dtype == torch.bfloat16 and x.device.type == "cpu" and x.shape[0] >= F32_GEMM_MIN_ROWS
            and not cpu_bf16_gemm())


# float32 GEMMs on the CPU run on row counts padded with zero rows to a multiple of this, so that a
# row's product is the same whatever rows share its step (1 lane or 8, a prompt piece of any
# length): torch's float32 `mm` (MKL) takes a small-matrix path below 12 rows, except at 4 and 8,
# whose rows differ from the general path's, and int8 K/V turns such a last-bit difference into
# a different code (tests/model/test_layouts.py). Measured on an AMD EPYC (Zen 4): padded to
# multiples of 8, every row count from 1 to 69 gives the rows of a 200-row product, for every shape tried.
F32_ROW_TILE = 8

Weight = torch.Tensor | PackedWeight  # a dense [out, in] weight, plain or in the GEMM's layout


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight^T (+ bias) in x's dtype: F.linear, or its float32 twin (`bf16_gemm_in_f32`),
    bfloat16 values multiplied exactly and summed in float32, rounded once to bfloat16, or the
    packed weight's GEMM (models/packed.py: only where bfloat16 GEMMs run natively); float32 on
    the CPU on rows padded to whole F32_ROW_TILE tiles."""
    if isinstance(weight, PackedWeight):
        return weight.mm(x, bias)
    if bf16_gemm_in_f32(x):
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
    if x.dtype == torch.float32 and x.device.type == "cpu" and x.shape[0] % F32_ROW_TILE:
        pad = F32_ROW_TILE - x.shape[0] % F32_ROW_TILE  # zero rows to a whole tile: see F32_ROW_TILE
        return F.linear(torch.cat([x, x.new_zeros(pad, x.shape[1])]), weight, bias)[: x.shape[0]]
    return F.linear(x, weight, bias)


def rows_alike(weight: Weight) -> bool:
    """Whether `linear` gives each row of x the same values whatever rows share the call
    (models/packed.py `PackedWeight.rows_alike`); a plain tensor's GEMM does not."""
    return isinstance(weight, PackedWeight) and weight.rows_alike


def small_rows(x: torch.Tensor, small: Callable[[torch.Tensor], torch.Tensor],
               dense: Callable[[torch.Tensor], torch.Tensor], first: int, alone: Sequence[int]) -> torch.Tensor:
    """x [rows, in] -> [rows, out]: rows [0, first) and each row of `alone` (>= first) by `small`
    (a quantized form, whose rows do not depend on the rows beside them) in one call, the rest
    by `dense` in one call over rows [first, rows) (the values it gives `alone` rows replaced)."""
    rows = x.shape[0]
    if first == rows or (first == 0 and not alone):
        return small(x) if first else dense(x)
    if first + len(alone) == rows:  # every row past `first` samples: all of them small
        return small(x)
    if not alone:
        return torch.cat((small(x[:first]), dense(x[first:])))
    picked = small(x[[*range(first), *alone]])  # [first + len(alone), out]
    y = dense(x[first:])
    if first:
        y = torch.cat((picked[:first], y))
    y[list(alone)] = picked[first:]
    return y


def dense_rows(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None,
               alone: Sequence[int] = ()) -> torch.Tensor:
    """x @ weight^T (+ bias) -> [rows, out]: every row in one GEMM (no copy of its output), then
    each row of `alone` again by itself in its place (a layer with only a dense weight), unless
    the GEMM's rows are alike at any row count (`rows_alike`)."""
    y = linear(x, weight, bias)
    if y.shape[0] > 1 and not rows_alike(weight):
        for a in alone:
            y[a : a + 1] = linear(x[a : a + 1], weight, bias)
    return y

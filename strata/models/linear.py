"""Projections: y = x W^T (+ b), W dense, the file's quantized blocks, an x8 pack or torch's int4 pack.

Which form a projection reads (`fused_linear`), as measured by benchmarks/quant_kernels.py
(one decoder layer of the default model, 1 thread, a Sapphire Rapids guest with AMX, and a
2-core AMD EPYC with AVX-512 VNNI, no AMX):

- `--weights native`: the file's blocks (models/quant.py) at every step, any dtype;
- `--weights auto`, bfloat16: a step's decode rows, when it has at most `QUANT_MAX_ROWS` of
  them, read Q4_0 and Q4_1 through strata's x8 kernel (q4x8.py: 8 columns interleaved,
  15-bit activations per 32 values; EPYC, VNNI: 1 row 0.10 ms, 8 rows 0.63 against torch's
  int4 kernel's 0.21, 0.69; AVX2 variant 1 row 0.19), with $STRATA_Q4_KERNEL=x8-int8 the same
  kernel on 8-bit activations (1 row 0.10 ms, 8 rows 0.37; outside
  tests/model/test_serving_accuracy.py's logit bound), with =int4 through torch's int4 kernel
  (q4.py; 1 row 0.29 ms against 0.40 ms for strata's per-row kernel on the AMX guest);
  Q5_0 (a Q4_K_M file's 576-wide projections) through the same kernel's 5-bit form (q4x8.py's
  q5x8, Q5_0's own bytes), and Q8_0 or Q5_0 fused with Q8_0 (q|k|v with a Q8_0 v) through its
  8-bit form, wherever it runs (q4x8.py's q8x8: 1 row 0.11 ms against 0.19 ms for Q8_0's blocks and 0.26
  for Q5_0's, EPYC Zen 4, VNNI, 2 threads; the AVX2 variant 0.10 ms against 0.18 for Q5_0's,
  an AMX guest), every other type through strata's kernel (Q8_0 0.31 ms; on a
  1024-wide layer Q4_K 0.61 ms against 0.79 ms for its int4 form); prompt rows (in any step:
  models/rows.py) and more decode rows read the dense copy, but for a prompt's sampling row,
  which reads the 4-bit form at any decode-row count. With AMX the dense bfloat16 GEMM
  is flat in rows and beats the x8 kernel from 5 rows on while its weights stay in cache
  (one layer called again and again), but a step streams every layer's weights from memory,
  and there 8 decode rows read the x8 form faster (an 8-lane step of the default model 28.8
  -> 22.8 ms, Sapphire Rapids-class guest, 2 threads: benchmarks/step_profile.py);
- `--weights auto`, float32: up to 8 decode rows read the blocks in place against float32
  activations, exact values (1 row 0.93 ms against 0.70 ms dense float32, 8 rows 1.9 against
  1.8, but 4 rows 1.2 against 1.2; torch's int4 kernel takes 9 ms), prompt rows and more dense;
- `--weights dense`, or a layer on an accelerator: dense.
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping, Sequence

import torch
import torch.nn.functional as F

from strata.models.fused import load_quant_ops
from strata.config import q4_kernel_from_env
from strata.models.q4 import GROUP, Q4_TYPES, Q4Weight, pack_for_cpu, q4_from_blocks
from strata.models.packed import PackedWeight, packs_weights
from strata.models.q4x8 import X8Matmul, x8_form
from strata.models.quant import QuantMatmul, QuantWeight
from strata.models.rows import RowKinds, dense_rows, linear, rows_alike, small_rows

# Decode steps of up to this many rows read a 4-bit form beside the dense copy (auto), with or
# without AMX (see the module docstring).
QUANT_MAX_ROWS = 8
# The types read as a 4-bit pack (bfloat16, decode rows): strata's x8 form (q4x8.py), or torch's
# int4 form (q4.py); Q4_K maps onto the int4 form too, but strata's kernel measured faster.
INT4_FASTER = (Q4_TYPES[0], Q4_TYPES[1])


class Linear:
    """One projection (q|k|v or gate|up side by side).

    `weight`: dense [out, in] in the compute dtype (plain, or a PackedWeight), or None; `quant`: the file's blocks read in
    place; `int4`: (packed codes, scales_and_zeros) for torch's int4 kernel; `x8`: Q4_0/Q4_1
    blocks with 8 columns interleaved for strata's x8 kernel (at most one 4-bit form). With a dense weight
    beside a 4-bit form, a step's decode rows read the 4-bit form when it has at most
    `max_rows` of them; its prompt rows read the dense weight (`__call__`).
    """

    def __init__(self, weight: torch.Tensor | PackedWeight | None, bias: torch.Tensor | None = None,
                 quant: QuantMatmul | None = None, int4: tuple[torch.Tensor, torch.Tensor] | None = None,
                 max_rows: int | None = None, x8: X8Matmul | None = None):
        assert weight is not None or quant is not None or x8 is not None
        assert (quant is not None) + (int4 is not None) + (x8 is not None) <= 1
        self.weight = weight
        self.bias = bias
        self.quant = quant
        self.int4 = int4
        self.x8 = x8
        self.max_rows = max_rows if weight is not None else None

    def __call__(self, x: torch.Tensor, kinds: RowKinds | None = None) -> torch.Tensor:
        """x [rows, in] -> [rows, out]; `kinds`: which rows are decode rows (None: all of them).
        With a dense weight beside a 4-bit form, the decode rows read the 4-bit form when there
        are at most `max_rows` of them, and so does every prompt row that samples (`alone`; but where
        the dense GEMM's rows are alike at any row count, `rows_alike`, it reads dense in its piece);
        the other prompt rows read the dense weight (models/rows.py): a row's path depends on
        its kind and the step's decode-row count, never on the prompt rows beside it, and a
        sampling row's never on the rows beside it at all."""
        if self.weight is None:
            return self._four_bit(x)
        d = x.shape[0] if kinds is None else kinds.decode
        # sampling rows read dense within their piece where its GEMM's rows are alike (rows.py)
        alone = () if kinds is None or rows_alike(self.weight) else kinds.alone
        if self.max_rows is None:
            return dense_rows(x, self.weight, self.bias, alone)
        return small_rows(x, self._four_bit, self._dense, d if d <= self.max_rows else 0, alone)

    @property
    def quantized_rows(self) -> float:
        """The most decode rows a step may have for them to read the 4-bit form (`__call__`'s rule:
        every count without a dense weight, none with a dense weight and no max_rows)."""
        return math.inf if self.weight is None else (self.max_rows or 0)

    def _dense(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def _four_bit(self, x: torch.Tensor) -> torch.Tensor:
        if self.x8 is not None:
            y = self.x8(x)
        elif self.int4 is not None:
            y = torch._weight_int4pack_mm_for_cpu(x, self.int4[0], GROUP, self.int4[1])
        else:
            y = self.quant(x)
        return y if self.bias is None else y + self.bias

    @property
    def num_bytes(self) -> int:
        parts = [self.weight, self.bias, *(self.int4 or ())]
        return sum(t.numel() * t.element_size() for t in parts if t is not None) + (
            self.quant.num_bytes if self.quant is not None else 0) + (
            self.x8.num_bytes if self.x8 is not None else 0)


class Concat:
    """Projections side by side whose parts are stored differently (some types read in place,
    others dense): each run of parts is one Linear, their outputs concatenated."""

    def __init__(self, runs: list[Linear], bias: torch.Tensor | None):
        self.runs = runs
        self.bias = bias
        self.weight = None
        self.int4 = None
        self.x8 = None
        self.max_rows = None  # native: every step reads the 4-bit runs
        self.quant = next((r.quant for r in runs if r.quant is not None), None)

    def __call__(self, x: torch.Tensor, kinds: RowKinds | None = None) -> torch.Tensor:
        y = torch.cat([r(x, kinds) for r in self.runs], dim=-1)
        return y if self.bias is None else y + self.bias

    @property
    def num_bytes(self) -> int:
        return sum(r.num_bytes for r in self.runs) + (0 if self.bias is None else self.bias.numel() * self.bias.element_size())


def fused_linear(
    weights: MutableMapping[str, torch.Tensor | QuantWeight],
    names: Sequence[str],
    bias_names: Sequence[str] | None,
    weight_mode: str,
    dtype: torch.dtype,
    device: torch.device,
    pack: bool = False,
) -> Linear | Concat:
    """One projection computing `names` side by side. Parts stored as `name + ".quant"` are
    read as the module docstring says; elsewhere they are dequantised. The parts are taken out
    of `weights` (the unfused copies go as the model is built, not after it). `pack`: its dense
    weight is held in the GEMM's layout where that runs (models/packed.py; not for storage the
    expert cache copies, which must stay plain tensors)."""
    quant = [weights.pop(n + ".quant", None) for n in names]
    parts = [weights.pop(n) if n in weights or quant[i] is None else None for i, n in enumerate(names)]
    bias = torch.cat([weights.pop(b) for b in bias_names]) if bias_names else None
    in_place = device.type == "cpu" and weight_mode != "dense" and load_quant_ops() is not None

    def dense(i: int) -> torch.Tensor:
        w = parts[i]
        if w is None:  # native: only the quantized bytes were loaded
            w = quant[i].dequantize(dtype).to(device)
        return w

    packed = pack and packs_weights(dtype, device)

    def all_dense() -> torch.Tensor | PackedWeight:
        w = torch.cat([dense(i) for i in range(len(names))])
        return PackedWeight(w) if packed else w

    if not in_place or all(q is None for q in quant):
        return Linear(all_dense(), bias)
    if weight_mode == "auto":
        if any(q is None for q in quant):
            return Linear(all_dense(), bias)
        rows = QUANT_MAX_ROWS
        if dtype == torch.bfloat16 and all(q.qtype in INT4_FASTER for q in quant):
            kernel = q4_kernel_from_env()
            if kernel != "int4" and quant[0].in_features % GROUP == 0:
                x8 = X8Matmul.from_parts(quant, act_bits=8 if kernel == "x8-int8" else 15)
                return Linear(all_dense(), bias, max_rows=rows, x8=x8)
            q4 = Q4Weight.cat([q4_from_blocks(q.raw.numpy(), q.qtype, (q.out_features, q.in_features)) for q in quant])
            return Linear(all_dense(), bias, int4=pack_for_cpu(q4, dtype), max_rows=rows)
        form = x8_form([q.qtype for q in quant]) if dtype == torch.bfloat16 else None
        if form is not None:
            act_bits = 8 if q4_kernel_from_env() == "x8-int8" else 15
            make = X8Matmul.from_q5x8_parts if form == "q5x8" else X8Matmul.from_q8x8_parts
            return Linear(all_dense(), bias, max_rows=rows, x8=make(quant, act_bits))
        return Linear(all_dense(), bias, QuantMatmul(quant), max_rows=rows)
    runs: list[Linear] = []
    i = 0
    while i < len(names):  # native: consecutive parts read the same way share one call
        j = i
        while j < len(names) and (quant[j] is None) == (quant[i] is None):
            j += 1
        if quant[i] is not None:
            runs.append(Linear(None, None, QuantMatmul(quant[i:j])))
        else:
            w = torch.cat([dense(k) for k in range(i, j)])
            runs.append(Linear(PackedWeight(w) if packed else w, None))
        i = j
    if len(runs) == 1:
        runs[0].bias = bias
        return runs[0]
    return Concat(runs, bias)

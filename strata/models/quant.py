"""GGUF quantized weights kept as the file's bytes and read in place (strata/csrc/quant_*.cpp).

A `QuantWeight` is one tensor's GGML blocks exactly as the file stores them, one weight
row per tensor row; nothing is unpacked or repacked. `QuantMatmul` multiplies activation
rows by one projection's parts (q|k|v, gate|up: each part may have its own type) in one
kernel call that reads every weight row once for all rows of the step:

- bfloat16 activations are quantized to 8 bits per block (per 32 values, or per 256 with
  sums per 16 for the K-quants, as llama.cpp's ggml does) and multiplied by integer dot
  products: each value is off by at most half a step, max|x| / 254 of its block;
- float32 activations meet the weights dequantised to float32 block by block: the same
  values as the dense dequantised weights, float32 accumulation (float32 stays exact).

Embedding lookups dequantise only the looked-up rows (`dequantize_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from strata.models.fused import load_quant_ops

# The types the kernels read in place; any other quantized type loads dense.
KERNEL_TYPES = frozenset({QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K})


@dataclass(frozen=True)
class QuantWeight:
    raw: torch.Tensor  # uint8 [out, bytes per row]: the GGML blocks of `qtype`, as stored
    qtype: int  # GGML type id (one of KERNEL_TYPES)
    in_features: int

    @property
    def out_features(self) -> int:
        return self.raw.shape[0]

    @property
    def num_bytes(self) -> int:
        return self.raw.numel()

    def rows(self, order: torch.Tensor) -> QuantWeight:
        """Rows in `order` (whole rows of bytes: a row's blocks never mix with another's)."""
        return QuantWeight(self.raw[order].contiguous(), self.qtype, self.in_features)

    def dequantize_rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[len(ids), in] in `dtype` (float32 or bfloat16): rows `ids`, dequantised."""
        ops = load_quant_ops()
        if ops is None:  # no kernels here: gguf-py's numpy dequantisation of the same rows
            from gguf.quants import dequantize

            rows = self.raw[ids.cpu()].numpy()
            return torch.from_numpy(dequantize(rows, QT(self.qtype)).reshape(len(rows), -1)).to(dtype)
        return ops.quant_dequant_rows(self.raw, self.qtype, ids.to(torch.int64), dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[out, in] in `dtype`: the dense weight (bit for bit gguf-py's dequantisation in float32)."""
        return self.dequantize_rows(torch.arange(self.out_features), dtype)


def quant_from_blocks(raw: np.ndarray, qtype: QT, shape: tuple[int, int]) -> QuantWeight:
    """`raw`: a tensor's bytes, uint8 [out, bytes per row]; `shape`: (out, in)."""
    tensor = torch.from_numpy(np.array(raw, dtype=np.uint8).reshape(shape[0], -1))  # an owned copy
    return QuantWeight(tensor, int(qtype), shape[1])


class QuantMatmul:
    """x [rows, in] -> [rows, sum of the parts' out] (each part's output side by side)."""

    def __init__(self, parts: list[QuantWeight]):
        assert parts and all(p.in_features == parts[0].in_features for p in parts)
        self.parts = parts
        self._bind()

    def _bind(self) -> None:
        ops = load_quant_ops()
        if ops is None:
            raise RuntimeError("strata's quantized kernels are not built (strata/_decode_ops): "
                               "reinstall with a compiler (`make venv`) or use --weights dense")
        self._kernel = ops.QuantLinear([p.raw for p in self.parts], [p.qtype for p in self.parts])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """float32 x: dequantised weights (exact values); bfloat16 x: 8-bit activations."""
        return self._kernel(x.contiguous(), x.dtype != torch.float32)

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)

    @property
    def num_bytes(self) -> int:
        return sum(p.num_bytes for p in self.parts)

    def __getstate__(self) -> dict:
        """Pickled as its parts (the prepared-model cache); the kernel handle is rebound on load."""
        return {"parts": self.parts}

    def __setstate__(self, state: dict) -> None:
        self.parts = state["parts"]
        self._bind()

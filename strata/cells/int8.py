"""int8 K/V (`--kv int8`): symmetric int8 per (cell, K/V head) with a float16 scale.

One layer's K (or V) is `Int8Cells`: `data` int8 [kv_heads, cells, head_dim] and `scale`
float16 [kv_heads, cells], scale = absmax / 127 over the head's `head_dim` values of
the cell. A cell is quantised when it is written (`write` here, or the fused rope-write in place with
the same values: `write_targets`) and dequantised (int8 x scale,
in the compute dtype) by every read: torch's reads right before attention, the fused decode
attention (strata/csrc/decode_attention.cpp) as it reads each cell in place. Every read path
dequantises the same stored values to the same numbers.

Bytes per cell and layer: 2 (K and V) x kv_heads x (head_dim + 2); for SmolLM2-135M
(30 layers, 3 heads of 64) 30 x 2 x 3 x 66 = 11,880 bytes against 23,040 in bf16 (51.6 %).
"""

from __future__ import annotations

import torch

from strata.cells.dense import strided
from strata.cells.protocol import WriteTargets

SCALE_DTYPE = torch.float16
QMAX = 127


def quantise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (int8 [..., head_dim], float16 scale [...]); x ~ q * scale."""
    xf = x.float()
    scale = (xf.abs().amax(-1) / QMAX).to(SCALE_DTYPE)  # rounded first: q is computed against the stored scale
    divisor = torch.where(scale > 0, scale.float(), 1.0)  # a zero scale (|x| < 127 x 2^-25): q = 0
    q = (xf / divisor.unsqueeze(-1)).round_().clamp_(-QMAX, QMAX)
    return q.to(torch.int8), scale


def dequantise(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 [..., head_dim] x scale [...] -> [..., head_dim] in `dtype` (float32 products, then rounded).

    int8 x float32 promotes inside the one multiply: no float32 copy of the int8 values."""
    return torch.mul(q, scale.float().unsqueeze(-1)).to(dtype)


class Int8Cells:
    """One layer's K or V in int8 with a scale per (head, cell); cells on dim 1 of both tensors."""

    def __init__(self, data: torch.Tensor, scale: torch.Tensor):
        self.data = data  # int8 [kv_heads, cells, head_dim]
        self.scale = scale  # float16 [kv_heads, cells]

    @classmethod
    def zeros(cls, num_kv_heads: int, num_cells: int, head_dim: int, device: torch.device) -> Int8Cells:
        return cls(torch.zeros(num_kv_heads, num_cells, head_dim, dtype=torch.int8, device=device),
                   torch.zeros(num_kv_heads, num_cells, dtype=SCALE_DTYPE, device=device))

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The tensors holding cells (on dim 1): what a cell copy copies."""
        return self.data, self.scale

    def write(self, index: torch.Tensor, x: torch.Tensor) -> None:
        """x [kv_heads, len(index), head_dim] quantised into flat cells `index`."""
        q, scale = quantise(x)
        self.data.index_copy_(1, index, q)
        self.scale.index_copy_(1, index, scale)

    def read(self, cells: slice | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[kv_heads, cells, head_dim] in `dtype`: a slice of flat cells or a gather of them."""
        return dequantise(self.data[:, cells], self.scale[:, cells], dtype)

    def read_strided(self, first: int, distance: int, num_slots: int, num_cells: int,
                     dtype: torch.dtype) -> torch.Tensor:
        """[slots, kv_heads, num_cells, head_dim]: slot s's cells start at first + s * distance."""
        return dequantise(strided(self.data, first, distance, num_slots, num_cells),
                          strided(self.scale, first, distance, num_slots, num_cells), dtype)

    def kernel_view(self, dtype: torch.dtype) -> torch.Tensor | None:
        return None  # not stored in a compute dtype: the fused decode attention reads `kernel_scaled_reads`

    def kernel_reads(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...] | None:
        return None

    def kernel_scaled_reads(self) -> tuple[tuple[torch.Tensor], tuple[torch.Tensor]]:
        return (self.data,), (self.scale,)

    def write_targets(self, v: Int8Cells, index: torch.Tensor, dtype: torch.dtype) -> WriteTargets | None:
        """The storages and scales, for activations in any dtype: rope_write quantises each new
        row as `quantise` does (strata/csrc/kv_int8.h)."""
        return WriteTargets([self.data], [v.data], [index], [self.scale], [v.scale])

    def zeros_like(self, num_cells: int, device: torch.device) -> Int8Cells:
        heads, _, dim = self.data.shape
        return Int8Cells.zeros(heads, num_cells, dim, device)

    def pinned(self) -> Int8Cells:
        return Int8Cells(self.data.pin_memory(), self.scale.pin_memory())

"""One layer's K (or V) cells stored as they are read: a [kv_heads, cells, head_dim] tensor in
the K/V dtype (f32, f16 or bf16). See cells/protocol.py."""

from __future__ import annotations

import torch

from strata.cells.protocol import WriteTargets


def strided(t: torch.Tensor, first: int, distance: int, num_slots: int, num_cells: int) -> torch.Tensor:
    """[slots, kv_heads, num_cells, *rest] view of `t` [kv_heads, cells, *rest]."""
    head_stride, cell_stride, *rest = t.stride()
    return t.as_strided(
        (num_slots, t.shape[0], num_cells, *t.shape[2:]),
        (distance * cell_stride, head_stride, cell_stride, *rest),
        t.storage_offset() + first * cell_stride,
    )


class DenseCells:
    def __init__(self, data: torch.Tensor):
        self.data = data  # [kv_heads, cells, head_dim]

    @classmethod
    def zeros(cls, num_kv_heads: int, num_cells: int, head_dim: int, dtype: torch.dtype,
              device: torch.device) -> DenseCells:
        return cls(torch.zeros(num_kv_heads, num_cells, head_dim, dtype=dtype, device=device))

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def parts(self) -> tuple[torch.Tensor, ...]:
        return (self.data,)

    def read(self, cells: slice | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.data[:, cells].to(dtype)

    def read_strided(self, first: int, distance: int, num_slots: int, num_cells: int,
                     dtype: torch.dtype) -> torch.Tensor:
        return strided(self.data, first, distance, num_slots, num_cells).to(dtype)

    def write(self, index: torch.Tensor, x: torch.Tensor) -> None:
        self.data.index_copy_(1, index, x.to(self.data.dtype))

    def kernel_view(self, dtype: torch.dtype) -> torch.Tensor | None:
        return self.data if self.data.dtype == dtype else None

    def kernel_reads(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...] | None:
        return (self.data,) if self.data.dtype == dtype else None

    def kernel_scaled_reads(self) -> None:
        return None  # stored unscaled: `kernel_reads`

    def write_targets(self, v: DenseCells, index: torch.Tensor, dtype: torch.dtype) -> WriteTargets | None:
        k_view, v_view = self.kernel_view(dtype), v.kernel_view(dtype)
        return None if k_view is None or v_view is None else WriteTargets([k_view], [v_view], [index])

    def zeros_like(self, num_cells: int, device: torch.device) -> DenseCells:
        heads, _, dim = self.data.shape
        return DenseCells.zeros(heads, num_cells, dim, self.data.dtype, device)

    def pinned(self) -> DenseCells:
        return DenseCells(self.data.pin_memory())

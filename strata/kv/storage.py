"""The tensors behind chunk ids: per layer, K and V for every cell of every chunk.

Layout per layer: K and V are each [kv_heads, num_chunks * chunk_size, head_dim]
(head-major, so the cells of one head are contiguous and a gather over cells gives
[kv_heads, cells, head_dim] ready for a batched matmul). Cell `c` of chunk `i` is
flat cell `i * chunk_size + c` in every layer. Each layer's tensors live on that
layer's device (a layer split gives each device its layers' share of every chunk).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from strata.kv.table import CellCopy

KV_TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


class KVStorage:
    def __init__(
        self,
        num_chunks: int,
        chunk_size: int,
        num_kv_heads: int,
        head_dim: int,
        kv_dtype: str,
        layer_devices: Sequence[torch.device],
    ):
        self.num_chunks = num_chunks
        self.chunk_size = chunk_size
        self.dtype = KV_TORCH_DTYPES[kv_dtype]
        self.layer_devices = list(layer_devices)
        shape = (num_kv_heads, num_chunks * chunk_size, head_dim)
        # torch.zeros touches every page, so the memory is committed at start.
        self.k = [torch.zeros(shape, dtype=self.dtype, device=d) for d in self.layer_devices]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=d) for d in self.layer_devices]
        self.bytes_per_cell = 2 * len(self.layer_devices) * num_kv_heads * head_dim * self.k[0].element_size()

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def num_bytes(self) -> int:
        return self.bytes_per_cell * self.num_chunks * self.chunk_size

    def copy_cells(self, copies: Sequence[CellCopy]) -> int:
        """Runs `copies` in every layer; returns the number of bytes copied."""
        if not copies:
            return 0
        for src, dst, n in self._runs(copies):
            for k, v in zip(self.k, self.v):
                k[:, dst : dst + n].copy_(k[:, src : src + n])
                v[:, dst : dst + n].copy_(v[:, src : src + n])
        return sum(cp.num_cells for cp in copies) * self.bytes_per_cell

    def _runs(self, copies: Sequence[CellCopy]) -> list[tuple[int, int, int]]:
        """(flat src, flat dst, cells): copies that continue each other merge into one run."""
        c = self.chunk_size
        runs: list[list[int]] = []
        for cp in copies:
            src, dst = cp.src_chunk * c + cp.start, cp.dst_chunk * c + cp.start
            if runs and runs[-1][0] + runs[-1][2] == src and runs[-1][1] + runs[-1][2] == dst:
                runs[-1][2] += cp.num_cells
            else:
                runs.append([src, dst, cp.num_cells])
        assert all(s + n <= d or d + n <= s for s, d, n in runs), "a copy overlaps its source"
        return [tuple(r) for r in runs]

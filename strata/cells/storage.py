"""The tensors behind chunk ids: per layer, K and V for every cell of every chunk.

Layout per layer: K and V are each [kv_heads, num_chunks * chunk_size, head_dim]
(head-major, so the cells of one head are contiguous and a gather over cells gives
[kv_heads, cells, head_dim] ready for a batched matmul). Cell `c` of chunk `i` is
flat cell `i * chunk_size + c` in every layer. Each layer's tensors live on that
layer's device (a layer split gives each device its layers' share of every chunk).
With `--kv int8` each layer's K and V are `Int8Cells` (cells/int8.py): int8 cells plus a
float16 scale per (head, cell), both with cells on dim 1, both copied by a cell copy.

With layer groups (kv/groups.py) each group's layers hold that group's chunks: the full
group's layers `num_chunks`, a windowed group's layers its own (smaller) pool's; a chunk
id then indexes one slot in every layer of its group, and a cell copy names its group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from strata.cells.dense import DenseCells
from strata.cells.int8 import SCALE_DTYPE, Int8Cells
from strata.cells.protocol import Cells
from strata.kv.groups import LayerGroup, group_of_layers
from strata.kv.table import CellCopy

KV_TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8}


def kv_bytes_per_cell(kv_dtype: str, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
    """K and V of one position in every layer, int8 scales included (the pool's and the memory guard's figure)."""
    elem = torch.empty(0, dtype=KV_TORCH_DTYPES[kv_dtype]).element_size()
    per_head = head_dim * elem
    if kv_dtype == "int8":
        per_head += torch.empty(0, dtype=SCALE_DTYPE).element_size()
    return 2 * num_layers * num_kv_heads * per_head


class KVStorage:
    def __init__(
        self,
        num_chunks: int,
        chunk_size: int,
        num_kv_heads: int,
        head_dim: int,
        kv_dtype: str,
        layer_devices: Sequence[torch.device],
        pin_memory: bool = False,
        groups: Sequence[LayerGroup] = (),
        group_chunks: Sequence[int] = (),
    ):
        """`groups` (with more than one) and `group_chunks`: the layer groups and each one's chunks
        (group 0's is `num_chunks`); empty: one group of every layer."""
        self.num_chunks = num_chunks
        self.chunk_size = chunk_size
        self.dtype = KV_TORCH_DTYPES[kv_dtype]
        self.layer_devices = list(layer_devices)
        self.kv_dtype = kv_dtype
        num_layers = len(self.layer_devices)
        self.groups = tuple(groups) if len(groups) > 1 else ()
        self.windows = tuple(g.window for g in self.groups[1:])  # each windowed group's, in order
        self.group_chunks = (num_chunks, *group_chunks[1:]) if self.groups else (num_chunks,)
        self.layer_group = group_of_layers(self.groups, num_layers) if self.groups else [0] * num_layers

        # zeros touch every page, so the memory is committed at start
        def zeros(i: int) -> Cells:
            device, num_cells = self.layer_devices[i], self.group_chunks[self.layer_group[i]] * chunk_size
            if kv_dtype == "int8":
                return Int8Cells.zeros(num_kv_heads, num_cells, head_dim, device)
            return DenseCells.zeros(num_kv_heads, num_cells, head_dim, self.dtype, device)

        self.k: list[Cells] = [zeros(i) for i in range(num_layers)]
        self.v: list[Cells] = [zeros(i) for i in range(num_layers)]
        if pin_memory:  # host K/V in front of an accelerator's ring: copies can be non-blocking
            self.k = [t.pinned() for t in self.k]
            self.v = [t.pinned() for t in self.v]
        # Called with (flat cell, cells, group) after a write that does not go through attention
        # (cell copies, session restores): the ring drops its device copies of those cells.
        self.write_listeners: list[Callable[[int, int, int], None]] = []
        self.bytes_per_cell = kv_bytes_per_cell(kv_dtype, len(self.layer_devices), num_kv_heads, head_dim)
        self.layer_bytes_per_cell = kv_bytes_per_cell(kv_dtype, 1, num_kv_heads, head_dim)

    @property
    def num_layers(self) -> int:
        return len(self.k)

    @property
    def num_bytes(self) -> int:
        return sum(self.group_chunks[g] for g in self.layer_group) * self.chunk_size * self.layer_bytes_per_cell

    def group_bytes_per_cell(self, group: int) -> int:
        """K and V of one position in the layers of `group`."""
        return sum(1 for g in self.layer_group if g == group) * self.layer_bytes_per_cell

    def layer_caches(self, i: int):
        """Layer i's K and V as attention reads and writes them (the ring's step has the same method)."""
        return self.k[i], self.v[i]

    def cells_written(self, flat_cell: int, num_cells: int, group: int = 0) -> None:
        """Cells [flat_cell, flat_cell + num_cells) of layer group `group` were written other than by attention."""
        for listener in self.write_listeners:
            listener(flat_cell, num_cells, group)

    def copy_cells(self, copies: Sequence[CellCopy]) -> int:
        """Runs `copies` in every layer; returns the number of bytes copied."""
        if not copies:
            return 0
        for group in sorted({cp.group for cp in copies}):
            layers = [i for i, g in enumerate(self.layer_group) if g == group]
            tensors = [t for i in layers for kv in (self.k[i], self.v[i]) for t in kv.parts]
            for src, dst, n in self._runs([cp for cp in copies if cp.group == group]):
                for t in tensors:  # K and V (and their int8 scales) of the group's layers: cells on dim 1
                    t[:, dst : dst + n].copy_(t[:, src : src + n])
                self.cells_written(dst, n, group)
        return sum(cp.num_cells * self.group_bytes_per_cell(cp.group) for cp in copies)

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


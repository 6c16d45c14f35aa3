"""What the fused decode attention reads in place from a layer's K/V cells (the DecodeSpans
read and the one-call layer, models/fused_layer.py): cells stored in the compute dtype, or
int8 cells with their scales (cells/protocol.py `kernel_reads`, `kernel_scaled_reads`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from strata.cells.protocol import Cells


@dataclass(slots=True)  # not frozen: one is made per layer and step (as cells/protocol.py's WriteTargets)
class KernelReads:
    """What the fused decode attention reads in place: K and V storages (one, or the ring's
    arena and staging), with their float16 scales where the cells are int8 (else empty)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    k_scales: list[torch.Tensor]
    v_scales: list[torch.Tensor]


def kernel_reads(k_cache: Cells, v_cache: Cells, dtype: torch.dtype) -> KernelReads | None:
    """The caches' in-place reads for the fused decode attention at `dtype`: stored in `dtype`,
    or int8 with their scales; None where neither (torch's reads then)."""
    k, v = k_cache.kernel_reads(dtype), v_cache.kernel_reads(dtype)
    if k is not None and v is not None:
        return KernelReads(list(k), list(v), [], [])
    ks, vs = k_cache.kernel_scaled_reads(), v_cache.kernel_scaled_reads()
    if ks is None or vs is None:
        return None
    return KernelReads(list(ks[0]), list(vs[0]), list(ks[1]), list(vs[1]))

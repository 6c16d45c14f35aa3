"""A dense projection weight held in the blocked layout of the CPU's bfloat16 GEMM (oneDNN).

torch's bfloat16 `mm` on the CPU hands a plain [out, in] weight to oneDNN, which reorders it
into its blocked layout on every call; for the row counts of prompt pieces and decode steps
(1 to a few hundred rows) that reorder is a large share of the call. A `PackedWeight` is that
layout made once at load, in place of the plain copy (the same bytes). The GEMM it runs is the
one `mm` runs after its reorder, so its results are the same (tests/unit/test_packed.py).

Only for bfloat16 weights on a CPU with AVX-512 BF16 or AMX (`packs_weights`): elsewhere the
plain weight stays. Pickled (the prepared-model cache) as the plain weight, packed again on
load.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

# The row count oneDNN is told to expect: the layout it picks was measured flat in rows.
ROWS_HINT = 64


def cpu_amx() -> bool:
    """Whether this CPU has AMX tiles (torch's bfloat16 GEMMs and flash attention run on them)."""
    return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())


def cpu_bf16_gemm() -> bool:
    """Whether this CPU runs bfloat16 GEMMs natively (AVX-512 BF16 or AMX)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or cpu_amx())


def packs_weights(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether dense projection weights of `dtype` on `device` are held as `PackedWeight`s."""
    if dtype != torch.bfloat16 or device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and cpu_bf16_gemm()


class PackedWeight:
    """[out, in] weight in oneDNN's blocked layout; `mm(x)` = x @ weight^T (+ bias)."""

    def __init__(self, weight: torch.Tensor):
        assert weight.dim() == 2 and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
        self.shape = weight.shape
        self.dtype = weight.dtype
        self.device = weight.device
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), ROWS_HINT)

    def mm(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [rows, in] -> [rows, out] in bfloat16, summed in float32 (a new tensor)."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def element_size(self) -> int:
        return self.packed.element_size()

    def plain(self) -> torch.Tensor:
        return self.packed.to_dense()

    def __getstate__(self) -> dict:
        return {"weight": self.plain()}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["weight"])


def warm_packed(weights: Iterable[PackedWeight], max_rows: int) -> None:
    """Runs the GEMM of each distinct shape among `weights` once at every row count from 1 to
    `max_rows`, on zeros. oneDNN makes a kernel (and caches it, for
    any weight of that shape) the first time it sees a row count, 1-6 ms a shape: a step whose
    prompt piece has a new length would pay that in every projection."""
    shapes = {tuple(w.shape): w for w in weights}
    for w in shapes.values():
        for rows in range(1, max_rows + 1):
            w.mm(torch.zeros(rows, w.shape[1], dtype=w.dtype, device=w.device))

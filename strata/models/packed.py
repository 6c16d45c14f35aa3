"""A dense projection weight held in the blocked layout of the CPU's bfloat16 GEMM.

torch's bfloat16 `mm` on the CPU hands a plain [out, in] weight to oneDNN, which reorders it
into its blocked layout on every call; for the row counts of prompt pieces and decode steps
(1 to a few hundred rows) that reorder is a large share of the call. A `PackedWeight` is a
GEMM's layout made once at load, in place of the plain copy (the same bytes):

- where the CPU has AMX-BF16 (and `$STRATA_DENSE_GEMM` is not `onednn`), and both sides are
  multiples of 32: strata's AMX kernel's tile layout (csrc/amx_gemm.cpp). A row's result
  depends on its own values only, whatever the row count; no kernel is made per row count.
- else oneDNN's layout, and the GEMM `mm` runs after its reorder (the same results).

Either way the GEMM sums exact bfloat16 products in float32 and rounds once
(tests/unit/test_packed.py). Only for bfloat16 weights on a CPU with AVX-512 BF16 or AMX
(`packs_weights`): elsewhere the plain weight stays. Pickled (the prepared-model cache) as the
plain weight, packed again on load.
"""

from __future__ import annotations

from collections.abc import Iterable

from types import ModuleType

import torch

from strata.config import DENSE_GEMM_ENV, dense_gemm_from_env
from strata.errors import ConfigError
from strata.models.fused import load_quant_ops

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


def amx_gemm() -> ModuleType | None:
    """The extension module where its AMX GEMM reads packed weights (`$STRATA_DENSE_GEMM`
    `auto` on a CPU with AMX-BF16, or `amx`), else None (oneDNN's)."""
    choice = dense_gemm_from_env()
    if choice == "onednn":
        return None
    ops = load_quant_ops()
    if ops is not None and hasattr(ops, "amx_available") and ops.amx_available():
        return ops
    if choice == "amx":
        raise ConfigError(f"${DENSE_GEMM_ENV}=amx: this CPU (or this build of strata's extension) has no AMX-BF16 GEMM")
    return None


class PackedWeight:
    """[out, in] weight in a GEMM's layout (the AMX kernel's tiles when `amx` is the extension
    module, else oneDNN's blocks); `mm(x)` = x @ weight^T (+ bias)."""

    def __init__(self, weight: torch.Tensor, amx: ModuleType | None = None):
        assert weight.dim() == 2 and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
        self.shape = weight.shape
        self.dtype = weight.dtype
        self.device = weight.device
        amx = amx if amx is not None else amx_gemm()
        self.amx = amx if amx is not None and weight.shape[0] % 32 == 0 and weight.shape[1] % 32 == 0 else None
        if self.amx is not None:
            self.packed = self.amx.amx_pack(weight)  # int16 [out / 16, in / 32, 16, 32]
        else:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), ROWS_HINT)

    def mm(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [rows, in] -> [rows, out] in bfloat16, summed in float32 (a new tensor)."""
        if self.amx is not None:
            return self.amx.amx_linear(x, self.packed, bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")

    @property
    def rows_alike(self) -> bool:
        """Whether `mm` gives each row the same values whatever rows share the call (the AMX
        kernel: every row's sums in one order at any row count); oneDNN picks its kernel by
        the row count."""
        return self.amx is not None

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def element_size(self) -> int:
        return self.packed.element_size()

    def plain(self) -> torch.Tensor:
        return self.amx.amx_unpack(self.packed) if self.amx is not None else self.packed.to_dense()

    def __getstate__(self) -> dict:
        return {"weight": self.plain()}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["weight"])  # the GEMM this process chooses


def warm_packed(weights: Iterable[PackedWeight], max_rows: int) -> None:
    """Runs the GEMM of each distinct shape among `weights` once at every row count from 1 to
    `max_rows`, on zeros. oneDNN makes a kernel (and caches it, for
    any weight of that shape) the first time it sees a row count, 1-6 ms a shape: a step whose
    prompt piece has a new length would pay that in every projection. The AMX kernel makes
    none: its weights are skipped."""
    shapes = {tuple(w.shape): w for w in weights if w.amx is None}
    for w in shapes.values():
        for rows in range(1, max_rows + 1):
            w.mm(torch.zeros(rows, w.shape[1], dtype=w.dtype, device=w.device))

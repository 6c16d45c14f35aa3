"""One expert's MLP and its storage: what the expert cache copies between host and slots.

An expert is a SwiGLU MLP, `down(silu(gate(x)) * up(x))`, gate and up side by side in one
projection. Its weights are a fixed list of storage tensors (`tensors()`: dense weights,
the file's quantized blocks, or torch's int4 pack, whatever its projections read); a slot
made by `empty_like` has tensors of the same shapes, dtypes and order on its device, and
`copy_from` fills them in place, so the kernels bound to a slot stay valid across copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.models.layers import silu_mul
from strata.models.linear import Concat, Linear
from strata.models.q4x8 import X8Matmul
from strata.models.quant import QuantMatmul, QuantWeight


def _linear_tensors(lin: Linear | Concat) -> list[torch.Tensor]:
    if isinstance(lin, Concat):
        return [t for run in lin.runs for t in _linear_tensors(run)] + ([lin.bias] if lin.bias is not None else [])
    out = [t for t in (lin.weight, lin.bias) if t is not None]
    out += list(lin.int4 or ())
    if lin.x8 is not None:
        out.append(lin.x8.packed)
    if lin.quant is not None:
        out += [p.raw for p in lin.quant.parts]
    return out


def _linear_like(lin: Linear | Concat, take) -> Linear | Concat:
    """The same projection over new storage: `take(t)` gives the tensor standing for `t`, in
    the order `_linear_tensors` lists them."""
    if isinstance(lin, Concat):
        runs = [_linear_like(r, take) for r in lin.runs]
        return Concat(runs, take(lin.bias) if lin.bias is not None else None)
    weight = take(lin.weight) if lin.weight is not None else None
    bias = take(lin.bias) if lin.bias is not None else None
    int4 = (take(lin.int4[0]), take(lin.int4[1])) if lin.int4 is not None else None
    quant = None
    if lin.quant is not None:
        quant = QuantMatmul([QuantWeight(take(p.raw), p.qtype, p.in_features) for p in lin.quant.parts])
    x8 = None
    if lin.x8 is not None:
        x8 = X8Matmul(take(lin.x8.packed), lin.x8.out_features, lin.x8.in_features, lin.x8.act_bits,
                      lin.x8.weight_bits)
    return Linear(weight, bias, quant, int4, lin.max_rows, x8)


@dataclass
class ExpertWeights:
    gate_up: Linear | Concat  # x [rows, hidden] -> [rows, 2 * expert_intermediate] (gate | up)
    down: Linear | Concat  # [rows, expert_intermediate] -> [rows, hidden]

    def __call__(self, x: torch.Tensor, ops=None) -> torch.Tensor:
        """x [rows, hidden] -> [rows, hidden]: the expert's output, not weighted by the router."""
        return self.down(silu_mul(self.gate_up(x), ops))

    def tensors(self) -> list[torch.Tensor]:
        """Every storage tensor, in a fixed order (the same for `empty_like`'s result)."""
        return _linear_tensors(self.gate_up) + _linear_tensors(self.down)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def empty_like(self, device: torch.device | str, pin: bool = False) -> ExpertWeights:
        """A slot: storage of the same shapes and dtypes on `device` (contents undefined);
        `pin`: page-locked host memory, for copies to an accelerator."""
        def take(t: torch.Tensor) -> torch.Tensor:
            return torch.empty(t.shape, dtype=t.dtype, device=device, pin_memory=pin)
        return ExpertWeights(_linear_like(self.gate_up, take), _linear_like(self.down, take))

    def copy_from(self, src: ExpertWeights, non_blocking: bool = False) -> None:
        """Fill this slot's storage with `src`'s (same layout: `src.empty_like` made it)."""
        mine, theirs = self.tensors(), src.tensors()
        assert len(mine) == len(theirs)
        for dst, s in zip(mine, theirs):
            assert dst.shape == s.shape and dst.dtype == s.dtype
            dst.copy_(s, non_blocking=non_blocking)

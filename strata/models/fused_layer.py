"""A decoder layer's decode step in one extension call (strata/csrc/decode_layer.cpp).

With the fused CPU ops loaded, a step whose rows are all decode rows, few enough for every
projection to read its quantized form (models/linear.py: the x8 pack, or the file's blocks
through strata's kernels; not torch's int4 form), and whose K/V is read by the fused decode
attention over spans (`DecodeSpans`) and written in place (`Cells.write_targets`), runs each
Llama-family layer as one call: the same ops in the same order as the layer's Python path,
so bit-identical to it, without the Python and dispatch between them. With int8 K/V the call
quantises the new rows where it writes them and reads the cells in place, as the Python
path's fused ops do. Any other step (prompt rows, more rows, an accelerator's ring, qk norms,
MoE layers) takes the Python path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from strata.models.attention import AttentionMeta
from strata.models.kernel_reads import kernel_reads
from strata.models.linear import Linear
from strata.models.q4x8 import X8Matmul
from strata.models.quant import QuantMatmul
from strata.models.rows import RowKinds

if TYPE_CHECKING:
    from strata.cells.protocol import Cells
    from strata.models.llama import DecoderLayer


def quantized_form(p: Linear) -> X8Matmul | QuantMatmul | None:
    """What `p` reads at decode rows that the extension reads too (torch's int4 form: None)."""
    return p.x8 if p.x8 is not None else p.quant


def kernel_of(p: Linear):
    """The extension's object behind `p`'s quantized form (Quant4x8Linear or QuantLinear)."""
    return quantized_form(p)._kernel


class FusedDecodeLayer:
    def __init__(self, kernel, projections: tuple[Linear, ...], head_dim: int):
        self.kernel = kernel  # the extension's DecodeLayer, over these projections' quantized forms
        self.projections = projections
        self.scale = head_dim**-0.5
        # The most decode rows at which every projection reads its quantized form. A projection's
        # forms are fixed once built; one given another form needs its layer's one-call form built again.
        self.max_rows = min(p.quantized_rows for p in projections)

    @staticmethod
    def build(layer: DecoderLayer, ops) -> FusedDecodeLayer | None:
        """The layer's one-call form, or None where it has none (no fused ops, qk norms, a MoE
        or biased MLP, a projection without a quantized form strata's kernels read)."""
        if ops is None or not hasattr(ops, "DecodeLayer") or layer.q_norm is not None:
            return None
        projections = (layer.qkv, layer.o, getattr(layer, "gate_up", None), getattr(layer, "down", None))
        if not all(isinstance(p, Linear) and quantized_form(p) is not None for p in projections):
            return None
        if layer.gate_up.bias is not None or layer.down.bias is not None:
            return None
        cfg = layer.cfg
        kernel = ops.DecodeLayer(layer.input_norm.weight, layer.post_norm.weight, layer.input_norm.eps,
                                 kernel_of(layer.qkv), layer.qkv.bias, kernel_of(layer.o), layer.o.bias,
                                 kernel_of(layer.gate_up), kernel_of(layer.down),
                                 cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        return FusedDecodeLayer(kernel, projections, cfg.head_dim)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: Cells, v_cache: Cells,
                 meta: AttentionMeta, kinds: RowKinds | None) -> torch.Tensor | None:
        """The layer's output for x [rows, hidden] (x itself updated in place, as the Python
        path's add_rms_norm does), or None where this step takes the Python path."""
        rows = x.shape[0]
        if rows > self.max_rows or (kinds is not None and kinds.decode != rows) or not x.is_contiguous():
            return None
        if len(meta.decode) != 1 or meta.prefills or meta.samples or meta.decode[0].kind != "spans":
            return None
        targets = k_cache.write_targets(v_cache, meta.write_index, x.dtype)
        reads = kernel_reads(k_cache, v_cache, x.dtype)
        if targets is None or reads is None:
            return None
        read = meta.decode[0]
        return self.kernel(x, cos, sin, targets.k, targets.v, targets.cells, targets.k_scales,
                           targets.v_scales, reads.k, reads.v, reads.k_scales, reads.v_scales, read.spans,
                           read.row_spans, self.scale)

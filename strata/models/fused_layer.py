"""A decoder layer's decode step in one extension call (strata/csrc/decode_layer.cpp).

With the fused CPU ops loaded, a step whose rows are all decode rows, few enough for every
projection to read its x8 form (models/linear.py), and whose K/V is read by the fused decode
attention over spans (`DecodeSpans`) and written in place (`Cells.write_targets`), runs each
Llama-family layer as one call: the same ops in the same order as the layer's Python path,
so bit-identical to it, without the Python and dispatch between them. Any other step (prompt
rows, more rows, int8 K/V, an accelerator's ring, qk norms, MoE layers) takes the Python path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from strata.models.attention import AttentionMeta
from strata.models.linear import Linear
from strata.models.rows import RowKinds

if TYPE_CHECKING:
    from strata.cells.protocol import Cells
    from strata.models.llama import DecoderLayer


class FusedDecodeLayer:
    def __init__(self, kernel, projections: tuple[Linear, ...], head_dim: int):
        self.kernel = kernel  # the extension's DecodeLayer, over these projections' x8 forms
        self.projections = projections
        self.forms = tuple(p.x8 for p in projections)  # the x8 forms the kernel was made of
        self.scale = head_dim**-0.5

    def reads_x8(self, rows: int) -> bool:
        """Whether every projection reads, at `rows` decode rows, the x8 form the kernel holds
        (Linear.__call__'s rule)."""
        return all(p.x8 is f and (p.weight is None or (p.max_rows is not None and rows <= p.max_rows))
                   for p, f in zip(self.projections, self.forms))

    @staticmethod
    def build(layer: DecoderLayer, ops) -> FusedDecodeLayer | None:
        """The layer's one-call form, or None where it has none (no fused ops, qk norms, a MoE
        or biased MLP, a projection without an x8 form)."""
        if ops is None or not hasattr(ops, "DecodeLayer") or layer.q_norm is not None:
            return None
        projections = (layer.qkv, layer.o, getattr(layer, "gate_up", None), getattr(layer, "down", None))
        if not all(isinstance(p, Linear) and p.x8 is not None for p in projections):
            return None
        if layer.gate_up.bias is not None or layer.down.bias is not None:
            return None
        cfg = layer.cfg
        kernel = ops.DecodeLayer(layer.input_norm.weight, layer.post_norm.weight, layer.input_norm.eps,
                                 layer.qkv.x8._kernel, layer.qkv.bias, layer.o.x8._kernel, layer.o.bias,
                                 layer.gate_up.x8._kernel, layer.down.x8._kernel,
                                 cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        return FusedDecodeLayer(kernel, projections, cfg.head_dim)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: Cells, v_cache: Cells,
                 meta: AttentionMeta, kinds: RowKinds | None) -> torch.Tensor | None:
        """The layer's output for x [rows, hidden] (x itself updated in place, as the Python
        path's add_rms_norm does), or None where this step takes the Python path."""
        rows = x.shape[0]
        if (kinds is not None and kinds.decode != rows) or not x.is_contiguous() or not self.reads_x8(rows):
            return None
        if len(meta.decode) != 1 or meta.prefills or meta.samples or meta.decode[0].kind != "spans":
            return None
        targets = k_cache.write_targets(v_cache, meta.write_index, x.dtype)
        k_reads, v_reads = k_cache.kernel_reads(x.dtype), v_cache.kernel_reads(x.dtype)
        if targets is None or k_reads is None or v_reads is None:
            return None
        read = meta.decode[0]
        k_dests, v_dests, indices = (list(t) for t in zip(*targets))
        return self.kernel(x, cos.squeeze(1), sin.squeeze(1), k_dests, v_dests, indices, list(k_reads),
                           list(v_reads), read.spans, read.row_spans, self.scale)

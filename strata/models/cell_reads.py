"""The ways attention reads a lane's cells, one type each.

Decode rows (one new token per lane):
- `DecodeContiguous`: one lane whose cells are one run of storage, read in place;
- `DecodeStrided`: lanes evenly spaced in storage (the reserved layout), one strided view;
- `DecodeRuns`: one long lane in a few runs of chunks, each read in place, merged by
  log-sum-exp;
- `DecodeGather`: lanes gathered through flat cell indices, padded to the longest;
- `DecodeSpans`: every decoding lane at once, each over its runs of storage in place,
  through the fused CPU kernel (strata/csrc/decode_attention.cpp).
Prefill pieces (a lane's new tokens, each attending to the cells up to its own):
- `PrefillContiguous`, `PrefillGather`, `PrefillRuns`: the same three ways;
- `PrefillSpans`: one piece over its runs of storage in place, through the AMX prompt kernel
  (strata/csrc/amx_attention.cpp).

Each type's `attend(q, k_cache, v_cache)` takes its own rows' rotated queries [rows,
heads, dim] and returns [rows, heads, dim]; a cache is one layer's `Cells` (cells/protocol.py),
read only through it (int8 cells are dequantised exactly where read). `to(device)` moves
its tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F

from strata.models.kernel_reads import kernel_reads

if TYPE_CHECKING:
    from strata.cells.protocol import Cells as Cache


def _moved(obj, device: torch.device):
    """`obj` with every tensor field (and tuple of tensors) on `device`."""
    changes = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, torch.Tensor):
            changes[f.name] = v.to(device, non_blocking=True)
        elif isinstance(v, tuple) and any(isinstance(t, torch.Tensor) for t in v):
            changes[f.name] = tuple(None if t is None else t.to(device, non_blocking=True) for t in v)
    return dataclasses.replace(obj, **changes) if changes else obj


def _grouped(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[rows, heads, dim] -> [rows, kv_heads, group, dim]: a K/V head's query heads are its
    query rows for SDPA, so K/V is read once per K/V head and never expanded."""
    rows, heads, dim = q.shape
    return q.view(rows, num_kv_heads, heads // num_kv_heads, dim)


@dataclass(frozen=True)
class DecodeContiguous:
    kind: ClassVar[str] = "contiguous"
    row_start: int
    cells: slice  # the lane's cells, flat

    num_rows = 1

    def attend(self, q: torch.Tensor, k_cache: Cache, v_cache: Cache) -> torch.Tensor:
        k = k_cache.read(self.cells, q.dtype).unsqueeze(0)  # [1, kvh, cells, dim], a view
        v = v_cache.read(self.cells, q.dtype).unsqueeze(0)
        o = F.scaled_dot_product_attention(_grouped(q, k.shape[1]), k, v)
        return o.reshape(q.shape)

    def to(self, device: torch.device) -> DecodeContiguous:
        return self


@dataclass(frozen=True)
class DecodeStrided:
    """Slot s's cells start at `first + s * distance`; rows are slots `slots` (None: row r is
    slot r). Padding reads other lanes' cells (written or zero, never garbage), masked."""

    kind: ClassVar[str] = "strided"
    row_start: int
    num_rows: int
    max_cells: int
    first: int
    distance: int
    num_slots: int
    slots: torch.Tensor | None  # [rows] long
    mask: torch.Tensor | None  # [slots, 1, 1, max_cells] bool, True on the slot's own cells

    def attend(self, q: torch.Tensor, k_cache: Cache, v_cache: Cache) -> torch.Tensor:
        k = k_cache.read_strided(self.first, self.distance, self.num_slots, self.max_cells, q.dtype)
        v = v_cache.read_strided(self.first, self.distance, self.num_slots, self.max_cells, q.dtype)  # [slots, kvh, cells, dim]
        qg = _grouped(q, k.shape[1])
        if self.slots is not None:  # slots no row uses get zero queries; their output is dropped
            full = q.new_zeros(self.num_slots, *qg.shape[1:])
            full[self.slots] = qg
            return F.scaled_dot_product_attention(full, k, v, attn_mask=self.mask)[self.slots].reshape(q.shape)
        return F.scaled_dot_product_attention(qg, k, v, attn_mask=self.mask).reshape(q.shape)

    def to(self, device: torch.device) -> DecodeStrided:
        return _moved(self, device)


@dataclass(frozen=True)
class DecodeGather:
    kind: ClassVar[str] = "gathered"
    row_start: int
    num_rows: int
    max_cells: int
    cell_index: torch.Tensor  # [rows * max_cells] flat cells (padding reads cell 0)
    mask: torch.Tensor | None  # [rows, 1, 1, max_cells] bool; None: no padding

    def attend(self, q: torch.Tensor, k_cache: Cache, v_cache: Cache) -> torch.Tensor:
        rows, _, dim = q.shape
        kvh = k_cache.shape[0]
        # Advanced indexing gathers along cells about 4x faster than index_select(1, ...).
        k = k_cache.read(self.cell_index, q.dtype).view(kvh, rows, self.max_cells, dim).transpose(0, 1)
        v = v_cache.read(self.cell_index, q.dtype).view(kvh, rows, self.max_cells, dim).transpose(0, 1)
        return F.scaled_dot_product_attention(_grouped(q, kvh), k, v, attn_mask=self.mask).reshape(q.shape)

    def to(self, device: torch.device) -> DecodeGather:
        return _moved(self, device)


@dataclass(frozen=True)
class DecodeSpans:
    """Row r's cells are spans[row_spans[r] : row_spans[r + 1]], each (first flat cell, cells),
    in position order: any layout, read in place, no padding or mask. The caches' kernel reads
    (cells stored in the compute dtype, or int8 with their scales: the runner uses this read
    only then): one storage, or the ring's arena and staging, whose flat cells continue each other."""

    kind: ClassVar[str] = "spans"
    row_start: int
    num_rows: int
    spans: torch.Tensor  # [runs, 2] long
    row_spans: torch.Tensor  # [rows + 1] long
    kernel: Callable  # the fused ops' decode_attention(q, k, v, spans, row_spans, scale, ...)

    def attend(self, q: torch.Tensor, k_cache: Cache, v_cache: Cache) -> torch.Tensor:
        r = kernel_reads(k_cache, v_cache, q.dtype)
        assert r is not None, "fused decode reads need cells in the compute dtype, or int8"
        return self.kernel(q, r.k[0], r.v[0], self.spans, self.row_spans, q.shape[-1] ** -0.5, *r.k[1:], *r.v[1:],
                           k_scales=r.k_scales, v_scales=r.v_scales)

    def to(self, device: torch.device) -> DecodeSpans:
        return self  # CPU only


def _attention_and_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None):
    """q [1, kvh, rows, dim], k/v [1, kvh, cells, dim] -> (out [1, kvh, rows, dim], lse [1, kvh, rows]).
    CPU: the flash kernel SDPA itself uses; elsewhere the same sums written out in float32."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)[:2]
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias.float()
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num_(0.0)  # a row that sees nothing: zeros
    return torch.matmul(probs, v.float()).to(q.dtype), lse


def _run_bias(mask: torch.Tensor | None, group: int, dtype: torch.dtype, device: torch.device):
    """(additive mask [group * rows, run cells]: 0 seen, -inf not; rows seeing none of the run
    [group * rows]) of a run's mask [rows, run cells], or (None, None) where every row sees all."""
    if mask is None:
        return None, None
    mask = mask.repeat(group, 1)  # (on `device`: the read was moved there)
    return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, float("-inf")), ~mask.any(-1)


def attend_runs(
    q: torch.Tensor,  # [rows, heads, dim]: one lane's new tokens
    k_cache: Cache,
    v_cache: Cache,
    runs: tuple[slice, ...],
    masks: tuple[torch.Tensor | None, ...],  # per run: [rows, run cells] bool, None: all seen
    biases: dict | None = None,  # the read's own cache of the masks' additive forms (every layer reads alike)
) -> torch.Tensor:
    """One lane's rows over cells in a few contiguous runs, without copying them: attention
    over each run in place, merged by each run's log-sum-exp (CPU: the kernel SDPA itself
    uses, which also returns the log-sum-exp). Returns [rows, heads, dim]."""
    rows, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    group = num_heads // num_kv_heads
    # A K/V head's query heads, each over every row, are its query rows: [1, kvh, group * rows, dim].
    qg = q.view(rows, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(1, num_kv_heads, -1, head_dim)
    key = (q.dtype, q.device, group)
    run_biases = None if biases is None else biases.get(key)
    if run_biases is None:
        run_biases = [_run_bias(mask, group, q.dtype, q.device) for mask in masks]
        if biases is not None:
            biases[key] = run_biases
    outs, lses = [], []
    for run, (bias, unseen) in zip(runs, run_biases):
        k = k_cache.read(run, q.dtype).unsqueeze(0)  # [1, kvh, run cells, dim], a view
        v = v_cache.read(run, q.dtype).unsqueeze(0)
        o, lse = _attention_and_lse(qg, k, v, bias)
        if unseen is not None:  # a row that sees none of the run: the kernel says lse 0, it is -inf
            lse = lse.masked_fill(unseen, float("-inf"))
        outs.append(o.float())  # [1, kvh, group * rows, dim]
        lses.append(lse)  # [1, kvh, group * rows]
    weights = torch.softmax(torch.stack(lses), dim=0).unsqueeze(-1)  # [runs, 1, kvh, group * rows, 1]
    o = (weights * torch.stack(outs)).sum(0).to(q.dtype)  # [1, kvh, group * rows, dim]
    return o.view(num_kv_heads, group, rows, head_dim).permute(2, 0, 1, 3).reshape(rows, num_heads, head_dim)


@dataclass(frozen=True)
class DecodeRuns:
    kind: ClassVar[str] = "runs"
    row_start: int
    runs: tuple[slice, ...]  # the lane's cells, in order

    num_rows = 1

    def attend(self, q: torch.Tensor, k_cache: Cache, v_cache: Cache) -> torch.Tensor:
        return attend_runs(q, k_cache, v_cache, self.runs, (None,) * len(self.runs))

    def to(self, device: torch.device) -> DecodeRuns:
        return self


def causal_bias_mask(rows: int, num_cells: int, device: torch.device) -> torch.Tensor:
    """[rows, cells] bool: row r (the lane's position num_cells - rows + r) sees cells up to its own."""
    return torch.arange(num_cells, device=device) <= torch.arange(num_cells - rows, num_cells,
                                                                   device=device).unsqueeze(1)


def _attend_cells(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, biases: dict) -> torch.Tensor:
    """q [rows, heads, dim], k/v [kvh, cells, dim] (rows the last `rows` cells) -> [rows, heads, dim].
    `biases`: the read's cache of its causal mask in additive form (0 / -inf, SDPA's own form of a
    bool mask: the same values, made once a step rather than by every layer)."""
    rows, heads, _ = q.shape
    cells = k.shape[1]
    mask = None
    if 1 < rows < cells:
        mask = biases.get((q.dtype, q.device))
        if mask is None:
            seen = causal_bias_mask(rows, cells, q.device)
            mask = biases[(q.dtype, q.device)] = torch.zeros(seen.shape, dtype=q.dtype,
                                                             device=q.device).masked_fill_(~seen, float("-inf"))
    o = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                       attn_mask=mask, is_causal=rows == cells and rows > 1,
                                       enable_gqa=heads != k.shape[0])
    return o[0].transpose(0, 1)


@dataclass(frozen=True)
class PrefillContiguous:
    kind: ClassVar[str] = "prefill-contiguous"
    row_start: int
    row_end: int
    cells: slice
    _biases: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # (`_attend_cells`)

    def attend(self, q: torch.Tensor, k_cache: Cache, v_cache: Cache) -> torch.Tensor:
        return _attend_cells(q, k_cache.read(self.cells, q.dtype), v_cache.read(self.cells, q.dtype),
                             self._biases)

    def to(self, device: torch.device) -> PrefillContiguous:
        return self


@dataclass(frozen=True)
class PrefillGather:
    kind: ClassVar[str] = "prefill-gathered"
    row_start: int
    row_end: int
    cell_index: torch.Tensor  # [cells] flat
    _biases: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # (`_attend_cells`)

    def attend(self, q: torch.Tensor, k_cache: Cache, v_cache: Cache) -> torch.Tensor:
        return _attend_cells(q, k_cache.read(self.cell_index, q.dtype), v_cache.read(self.cell_index, q.dtype),
                             self._biases)

    def to(self, device: torch.device) -> PrefillGather:
        return _moved(self, device)


@dataclass(frozen=True)
class PrefillRuns:
    kind: ClassVar[str] = "prefill-runs"
    row_start: int
    row_end: int
    runs: tuple[slice, ...]
    run_masks: tuple[torch.Tensor | None, ...]  # per run: [rows, <= rows cells] bool; None: all seen
    _biases: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # (`attend_runs`)

    def attend(self, q: torch.Tensor, k_cache: Cache, v_cache: Cache) -> torch.Tensor:
        return attend_runs(q, k_cache, v_cache, self.runs, self.run_masks, self._biases)

    def to(self, device: torch.device) -> PrefillRuns:
        return _moved(self, device)


@dataclass(frozen=True)
class PrefillSpans:
    """The piece's cells are `spans` (first flat cell, cells), in position order: any layout,
    read in place by the prompt kernel (cells stored in the compute dtype, one storage: the
    runner uses this read only then)."""

    kind: ClassVar[str] = "prefill-spans"
    row_start: int
    row_end: int
    spans: torch.Tensor  # [runs, 2] long
    kernel: Callable  # the fused ops' prompt_attention(q, k, v, spans, scale)

    def attend(self, q: torch.Tensor, k_cache: Cache, v_cache: Cache) -> torch.Tensor:
        k, v = k_cache.kernel_reads(q.dtype), v_cache.kernel_reads(q.dtype)
        assert k is not None and v is not None and len(k) == len(v) == 1, "prompt kernel reads: one storage, compute dtype"
        return self.kernel(q, k[0], v[0], self.spans, q.shape[-1] ** -0.5)

    def to(self, device: torch.device) -> PrefillSpans:
        return self  # CPU only


DecodeRead = DecodeContiguous | DecodeStrided | DecodeGather | DecodeRuns | DecodeSpans
PrefillRead = PrefillContiguous | PrefillGather | PrefillRuns | PrefillSpans

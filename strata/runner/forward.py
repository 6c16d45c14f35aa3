"""One batched forward over lanes' chunk tables, reading a model's own K/V storage in place.

The runner uses it for its model when no ring sits in front of the pool, and hands one to
the draft model's drafter (drafting/draft_model.py) for the draft model's K/V.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from strata.cells.storage import KVStorage
from strata.models.llama import LlamaModel
from strata.models.rows import RowKinds
from strata.runner.inputs import StepInputs, build_inputs, spans_max_row_cells
from strata.runner.reads import ChunkCells
from strata.step import LaneWork


class LaneForward:
    def __init__(self, model: LlamaModel, kv: KVStorage):
        self.model = model
        self.kv = kv
        # Strided and by-run decode reads (overlapping K/V views) on CPU only: accelerator SDPA
        # kernels have mishandled unusual K/V strides, and none was lent to test them; they gather.
        is_cpu = all(d.type == "cpu" for d in model.devices)
        self.cells = ChunkCells(kv.chunk_size, kv.num_chunks * kv.chunk_size if is_cpu else None)
        self.max_row_cells = spans_max_row_cells(model.dtype)  # prompt pieces the decode kernel reads
        self.prompt_kernel = model.prompt_attention_kernel(kv.dtype)  # and the others, where not SDPA

    def inputs(self, work: Sequence[LaneWork], fused_decode: bool = True) -> StepInputs:
        """`work`'s batched inputs; `fused_decode`: decode rows through the fused kernel where the
        model and K/V allow it."""
        kernel = self.model.decode_attention_kernel(self.kv.dtype) if fused_decode else None
        if self.kv.groups:  # each windowed group read through its own table (kv/groups.py)
            return build_inputs(work, self.cells, kernel, self.kv.windows, grouped=True,
                                max_row_cells=self.max_row_cells)
        return build_inputs(work, self.cells, kernel, self.model.cfg.windows, max_row_cells=self.max_row_cells,
                            prompt_kernel=self.prompt_kernel if fused_decode else None)

    def logits(self, inputs: StepInputs, logits_rows: torch.Tensor, kv=None, metas=None) -> torch.Tensor:
        """Float32 logits [rows, vocab] of `inputs`; `kv` and `metas`: another view of the cells
        and its addressing per window (the ring's step), else this storage read in place."""
        m = self.model
        metas = inputs.metas if metas is None else metas
        kinds = inputs.kinds
        if logits_rows is not inputs.logits_rows:  # other rows (all_logits): those of decode rows come first
            kinds = RowKinds(kinds.decode, int((logits_rows < kinds.decode).sum()), kinds.alone)
        return m.forward(
            inputs.input_ids.to(m.layer_devices[0], non_blocking=True),
            {d: inputs.positions.to(d, non_blocking=True) for d in m.devices},
            {d: {window: meta.to(d) for window, meta in metas.items()} for d in m.devices},
            self.kv if kv is None else kv,
            logits_rows.to(m.layer_devices[-1], non_blocking=True),
            kinds,
        )

    @torch.inference_mode()
    def sample_logits(self, work: Sequence[LaneWork]) -> tuple[torch.Tensor, tuple[LaneWork, ...]]:
        """Logits of the rows that sample, and their lanes in row order."""
        inputs = self.inputs(work)
        return self.logits(inputs, inputs.logits_rows), inputs.sample_work

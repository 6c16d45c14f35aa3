"""The model runner: one batched forward per step over every lane's chunk table, then sampling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from strata.kv.storage import KVStorage
from strata.models.llama import LlamaModel
from strata.kv.ring import KVRing
from strata.runner.drafter import ModelDrafter, with_drafts
from strata.runner.inputs import StepInputs, build_inputs
from strata.runner.ring_reads import ring_meta
from strata.runner.reads import ChunkCells
from strata.sampler import Sampler
from strata.sampling import SamplingParams
from strata.step import DraftOutcome, LaneWork, Sampled, StepOutput, StepPlan
from strata.verify import verify


class ModelRunner:
    def __init__(self, model: LlamaModel, kv: KVStorage, ring: KVRing | None = None,
                 drafter: ModelDrafter | None = None):
        self.model = model
        self.kv = kv
        self.ring = ring  # --kv-resident: attention reads the pool through the ring
        self.drafter = drafter  # --spec draft: the draft model, its K/V in the same chunks
        self.sampler = Sampler()
        # Strided decode reads (overlapping K/V views) on CPU only: accelerator SDPA kernels
        # have mishandled unusual K/V strides, and none was lent to test them; they gather.
        is_cpu = all(d.type == "cpu" for d in model.devices)
        self.cells = ChunkCells(kv.chunk_size, kv.num_chunks * kv.chunk_size if is_cpu else None)
        self.first_device = model.layer_devices[0]
        self.last_device = model.layer_devices[-1]

    @torch.inference_mode()
    def execute(
        self,
        plan: StepPlan,
        params: Mapping[str, SamplingParams],
        generators: Mapping[str, torch.Generator | None],
    ) -> StepOutput:
        """Runs `plan`'s copies and forward; samples one token for each lane that samples.

        Writes K/V only into cells the plan names (its copies' destinations and its work's
        new cells); changes no scheduler state, so a failure here can be undone by ending
        the plan's requests.
        """
        self.copy_cells(plan.copies)
        if not plan.work:
            return StepOutput(())
        work = plan.work
        if self.drafter is not None and any(w.draft_slots for w in work):
            work = with_drafts(work, self.drafter.propose(work))
        inputs = build_inputs(work, self.cells, self._decode_kernel())
        logits = self._forward(inputs, inputs.logits_rows, plan.busy_lanes)
        return self._sample(logits, inputs.sample_work, params, generators)

    def _sample(self, logits: torch.Tensor, work: Sequence[LaneWork], params: Mapping[str, SamplingParams],
                generators: Mapping[str, torch.Generator | None]) -> StepOutput:
        """logits [rows, vocab]: per lane of `work` in order, one row, or 1 + drafts rows to verify."""
        plain, drafted, row = [], [], 0
        for w in work:
            (drafted if w.num_drafts else plain).append((w, row))
            row += 1 + w.num_drafts
        sampled: list[Sampled] = []
        if plain:
            ids = [w.request_id for w, _ in plain]
            rows = logits if len(plain) == len(work) else logits[torch.tensor([r for _, r in plain])]
            out = self.sampler.sample(rows, [params[i] for i in ids], [generators[i] for i in ids])
            sampled += [Sampled(i, t, lp) for i, t, lp in zip(ids, out.token_ids, out.logprobs)]
        outcomes = []
        for w, r in drafted:
            rid = w.request_id
            v = verify(self.sampler, logits[r : r + 1 + w.num_drafts].float(), w.token_ids[1:], params[rid],
                       generators[rid])
            sampled += [Sampled(rid, t, lp) for t, lp in zip(v.token_ids, v.logprobs)]
            outcomes.append(DraftOutcome(rid, w.num_drafts, v.num_accepted, w.token_ids[1:]))
        return StepOutput(tuple(sampled), tuple(outcomes))

    def copy_cells(self, copies) -> int:
        """Cell copies in the pool's storage and the draft model's (same chunk ids); returns bytes."""
        copied = self.kv.copy_cells(copies)
        if self.drafter is not None:
            copied += self.drafter.kv.copy_cells(copies)
        return copied

    @torch.inference_mode()
    def logits_for(self, work: Sequence) -> torch.Tensor:
        """Float32 logits for every token row of `work` (tests compare them with transformers)."""
        inputs = build_inputs(work, self.cells, self._decode_kernel())
        return self._forward(inputs, torch.arange(inputs.input_ids.numel()))

    def _decode_kernel(self):
        """The fused decode attention for this step's decode rows, or None (the ring reads its own way)."""
        return self.model.decode_attention_kernel(self.kv.dtype) if self.ring is None else None

    def _forward(self, inputs: StepInputs, logits_rows: torch.Tensor, busy_lanes: Sequence[int] = ()) -> torch.Tensor:
        """The model over `inputs`, reading K/V from the pool or through the ring (whose budget
        counts the rings of `busy_lanes` too)."""
        kv, meta, step = self.kv, inputs.meta, None
        if self.ring is not None:
            step = self.ring.prepare(inputs.work, inputs.meta.write_index, busy_lanes)
            kv, meta = step, ring_meta(inputs.work, step)
        metas = {d: meta.to(d) for d in self.model.devices}
        positions = {d: inputs.positions.to(d, non_blocking=True) for d in self.model.devices}
        try:
            logits = self.model.forward(
                inputs.input_ids.to(self.first_device, non_blocking=True),
                positions,
                metas,
                kv,
                logits_rows.to(self.last_device, non_blocking=True),
            )
        except BaseException:
            if step is not None:
                self.ring.abort(step)
            raise
        if step is not None:
            step.finish()
        return logits

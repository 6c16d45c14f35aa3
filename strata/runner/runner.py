"""The model runner: one batched forward per step over every lane's chunk table, then sampling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from strata.cells.ring_groups import GroupedRing
from strata.cells.storage import KVStorage
from strata.drafting.draft_model import DraftModel, ModelDrafter, with_drafts
from strata.drafting.verify import verify
from strata.logit_controls import LogitControls
from strata.models.llama import LlamaModel
from strata.runner.forward import LaneForward
from strata.runner.inputs import StepInputs
from strata.runner.ring_reads import ring_metas
from strata.sampler import Sampler
from strata.sampling import SamplingParams
from strata.step import DraftOutcome, LaneWork, Sampled, StepOutput, StepPlan


class ModelRunner:
    def __init__(self, model: LlamaModel, kv: KVStorage, ring: GroupedRing | None = None,
                 draft: DraftModel | None = None):
        self.model = model
        self.kv = kv
        self.ring = ring  # --kv-resident: attention reads the pool through the ring
        self.lanes = LaneForward(model, kv)
        # --spec draft: the draft model, its K/V in the same chunks, read through its own forward
        self.drafter = ModelDrafter(draft, LaneForward(draft.model, draft.kv).sample_logits) if draft else None
        self.sampler = Sampler()

    @torch.inference_mode()
    def execute(
        self,
        plan: StepPlan,
        params: Mapping[str, SamplingParams],
        generators: Mapping[str, torch.Generator | None],
        controls: Mapping[str, LogitControls] | None = None,
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
        inputs = self.lanes.inputs(work, fused_decode=self.ring is None)  # the ring reads its own way
        logits = self._forward(inputs, inputs.logits_rows, plan.busy_lanes)
        return self._sample(logits, inputs.sample_work, params, generators, controls or {})

    def _sample(self, logits: torch.Tensor, work: Sequence[LaneWork], params: Mapping[str, SamplingParams],
                generators: Mapping[str, torch.Generator | None],
                controls: Mapping[str, LogitControls]) -> StepOutput:
        """logits [rows, vocab]: per lane of `work` in order, one row, or 1 + drafts rows to verify.
        Lanes with logit controls choose from their adjusted rows; logprobs stay the raw ones."""
        plain, drafted, row = [], [], 0
        for w in work:
            (drafted if w.num_drafts else plain).append((w, row))
            row += 1 + w.num_drafts
        chosen = logits
        if any(w.request_id in controls for w in work):
            chosen = logits.float().clone()  # [rows, vocab]
            for w, r in plain + drafted:
                if (c := controls.get(w.request_id)) is not None:
                    c.apply(chosen[r : r + 1 + w.num_drafts], w.token_ids[1:] if w.num_drafts else ())
        sampled: list[Sampled] = []
        if plain:
            ids = [w.request_id for w, _ in plain]
            index = None if len(plain) == len(work) else torch.tensor([r for _, r in plain], device=logits.device)
            rows, raw = (chosen, logits) if index is None else (chosen[index], logits[index])
            out = self.sampler.sample(rows, [params[i] for i in ids], [generators[i] for i in ids],
                                      raw=None if chosen is logits else raw)
            sampled += [Sampled(i, t, lp) for i, t, lp in zip(ids, out.token_ids, out.logprobs)]
        outcomes = []
        for w, r in drafted:
            rid = w.request_id
            span = slice(r, r + 1 + w.num_drafts)
            v = verify(self.sampler, chosen[span].float(), w.token_ids[1:], params[rid], generators[rid],
                       raw=None if chosen is logits else logits[span].float())
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
    def all_logits(self, work: Sequence[LaneWork]) -> torch.Tensor:
        """Float32 logits [tokens, vocab] for every token row of `work`, in row order, its K/V
        written as a step's would be (strata/testing.py compares them with transformers)."""
        inputs = self.lanes.inputs(work, fused_decode=self.ring is None)
        return self._forward(inputs, torch.arange(inputs.input_ids.numel()))

    def _forward(self, inputs: StepInputs, logits_rows: torch.Tensor, busy_lanes: Sequence[int] = ()) -> torch.Tensor:
        """The model over `inputs`, reading K/V from the pool or through the ring (whose budget
        counts the rings of `busy_lanes` too)."""
        if self.ring is None:
            return self.lanes.logits(inputs, logits_rows)
        write_index = {window: meta.write_index for window, meta in inputs.metas.items()}  # each group's pool cells
        step = self.ring.prepare(inputs.work, write_index, busy_lanes)
        try:
            kernel = self.model.decode_attention_kernel(self.kv.dtype)
            metas = ring_metas(inputs.work, step, self.model.cfg.windows, kernel, self.lanes.max_row_cells)
            logits = self.lanes.logits(inputs, logits_rows, step, metas)
        except BaseException:
            self.ring.abort(step)
            raise
        step.finish()
        return logits

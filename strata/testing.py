"""What tests and benchmarks need of an engine that no front end may see: every prompt
position's logits (compared with transformers, or between K/V dtypes).

The package never imports this module; it is the one module outside engine/ that reads the
engine's parts (tests/unit/test_seams.py allows it by name).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from strata.engine.engine import Engine
from strata.errors import ContextLengthExceeded, PoolFullError
from strata.step import StepOutput


@torch.inference_mode()
def prompt_logits(engine: Engine, prompt_ids: Sequence[int], as_decode: bool = False) -> torch.Tensor:
    """Float32 logits [tokens, vocab] for every position of `prompt_ids`, read in prompt pieces
    as the scheduler plans them. `as_decode`: each piece's rows computed as a decoding lane's
    (the decode path's projections and head, as a verify step reads its drafts) instead of as
    prompt rows. Runs on an idle engine; evicts every idle conversation first so nothing is
    reused, and frees its own K/V at the end."""
    scheduler, runner = engine._scheduler, engine._runner
    assert not scheduler.seqs, "prompt_logits runs on an idle engine"
    if len(prompt_ids) >= engine.max_context:
        raise ContextLengthExceeded(len(prompt_ids), engine.max_context)
    scheduler.clear_cache()
    request_id = "prompt-logits"
    scheduler.add(request_id, list(prompt_ids))
    rows = []
    while scheduler.seqs.get(request_id) is None or scheduler.seqs[request_id].is_prefilling:
        plan = scheduler.schedule()
        if plan.refused:
            raise PoolFullError(plan.refused[0].num_chunks_needed, plan.refused[0].num_chunks_free, 1)
        runner.copy_cells(plan.copies)
        work = tuple(dataclasses.replace(w, prompt=False) for w in plan.work) if as_decode else plan.work
        rows.append(runner.all_logits(work))
        scheduler.commit(plan, StepOutput())
    scheduler.abort(request_id)
    return torch.cat(rows)

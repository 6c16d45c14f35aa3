"""One step's work per lane: a decoding lane feeds its pending token; prefilling lanes
share a budget of `prefill_chunk` prompt tokens, oldest first, so long prompts are read
in pieces between decode steps."""

from __future__ import annotations

from collections.abc import Iterable

from strata.engine.conversation import Sequence
from strata.engine.plan import LaneWork


def build_work(seqs: Iterable[Sequence], prefill_chunk: int) -> tuple[LaneWork, ...]:
    """Lists each lane's tokens and advances its conversation by them (cells written this step)."""
    work = []
    budget = prefill_chunk
    for seq in sorted(seqs, key=lambda s: s.order):
        conv = seq.conv
        start = conv.num_cells
        if seq.is_prefilling:
            n = min(seq.num_prompt_left, budget)
            if n == 0:
                continue
            budget -= n
            tokens = seq.prompt_ids[start : start + n]
            do_sample = start + n == len(seq.prompt_ids)
        elif seq.pending is not None:
            tokens, seq.pending, do_sample = [seq.pending], None, True
        else:
            continue
        conv.token_ids.extend(tokens)
        conv.table.num_cells = start + len(tokens)
        work.append(LaneWork(seq.lane, seq.request_id, tuple(tokens), start, tuple(conv.table.chunk_ids), do_sample))
    return tuple(work)

"""One step's work per lane: a decoding lane feeds its pending token (and its drafts, when a
planner gave it some); prefilling lanes share a budget of `prefill_chunk` prompt tokens,
oldest first, so long prompts are read in pieces between decode steps (`prefill_alone`
tokens when no lane is decoding).

Planning only: nothing here changes a conversation or a sequence. The cells a step
writes are recorded by `commit_work` once the runner has returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from strata.drafting.planner import DraftPlanner, draft_cells_after, kept_tokens
from strata.engine.cache import ConversationCache
from strata.engine.conversation import Sequence
from strata.engine.lanes import Lanes
from strata.kv.layout import KVLayout
from strata.step import DraftOutcome, LaneWork


def build_work(seqs: Iterable[Sequence], prefill_chunk: int, prefill_alone: int | None = None,
               drafts: DraftPlanner | None = None) -> tuple[LaneWork, ...]:
    """Each lane's tokens for this step, starting at the cells its conversation holds.

    `prefill_alone`: the budget instead of `prefill_chunk` when no lane is decoding (no
    decode gap to keep short, so a lone prompt is read in fewer, larger pieces)."""
    work = []
    seqs = sorted(seqs, key=lambda s: s.order)
    decoding = any(not s.is_prefilling and s.pending is not None for s in seqs)
    budget = prefill_chunk if prefill_alone is None or decoding else max(prefill_chunk, prefill_alone)
    for seq in seqs:
        conv = seq.conv
        start = conv.num_cells
        lane_drafts = None
        if seq.is_prefilling:
            n = min(seq.num_prompt_left, budget)
            if n == 0:
                continue
            budget -= n
            tokens = tuple(seq.prompt_ids[start : start + n])
            do_sample = start + n == len(seq.prompt_ids)
        elif seq.pending is not None:
            tokens, do_sample = (seq.pending,), True
            if drafts is not None:
                tokens, lane_drafts = drafts.lane_drafts(seq)
        else:
            continue
        work.append(LaneWork(seq.lane, seq.request_id, tokens, start, tuple(conv.table.chunk_ids), do_sample,
                             seq.target_cells, lane_drafts, prompt=seq.is_prefilling))
    return tuple(work)


def commit_work(seqs: Mapping[str, Sequence], work: Iterable[LaneWork], lanes: Lanes,
                outcomes: Mapping[str, DraftOutcome] | None = None) -> None:
    """The runner wrote `work`'s cells: each conversation now holds them (and its tokens,
    recorded through the cache so that its prefix index follows); a lane that verified
    drafts holds its fed token and the accepted drafts only."""
    cache, layout = lanes.cache, lanes.layout
    for w in work:
        seq = seqs[w.request_id]
        conv = seq.conv
        assert conv.num_cells == w.start, (w.request_id, conv.num_cells, w.start)
        if not seq.is_prefilling:
            assert w.token_ids[0] == seq.pending, (w.request_id, w.token_ids, seq.pending)
            seq.pending = None  # fed: its K/V is written
            if w.drafts is not None:
                _commit_drafts(seq, w, (outcomes or {}).get(w.request_id), cache, layout)
                continue
        cache.append(conv, w.token_ids)


def _commit_drafts(seq: Sequence, w: LaneWork, outcome: DraftOutcome | None, cache: ConversationCache,
                   layout: KVLayout) -> None:
    """The conversation keeps the fed token and the kept drafts; the rest of the table's room
    past its cells goes back to the pool (whole chunks)."""
    conv = seq.conv
    cache.append(conv, kept_tokens(w, outcome))
    draft_cells = draft_cells_after(w, outcome)
    if draft_cells is not None:
        conv.draft_cells = draft_cells
    copies = layout.truncate(conv.table, conv.num_cells)
    assert not copies, "a lane's tail chunk is private: giving back rejected cells copies nothing"

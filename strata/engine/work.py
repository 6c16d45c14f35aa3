"""One step's work per lane: a decoding lane feeds its pending token; prefilling lanes
share a budget of `prefill_chunk` prompt tokens, oldest first, so long prompts are read
in pieces between decode steps (`prefill_alone` tokens when no lane is decoding).

Planning only: nothing here changes a conversation or a sequence. The cells a step
writes are recorded by `commit_work` once the runner has returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from strata.engine.cache import ConversationCache
from strata.engine.conversation import Sequence
from strata.engine.spec.drafts import commit_drafts
from strata.kv.layout import KVLayout
from strata.step import DraftOutcome, LaneWork


def build_work(seqs: Iterable[Sequence], prefill_chunk: int, prefill_alone: int | None = None) -> tuple[LaneWork, ...]:
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
        if seq.is_prefilling:
            n = min(seq.num_prompt_left, budget)
            if n == 0:
                continue
            budget -= n
            tokens = tuple(seq.prompt_ids[start : start + n])
            do_sample = start + n == len(seq.prompt_ids)
        elif seq.pending is not None:  # and the drafts planned for this step, if any
            drafts = seq.spec.drafts if seq.spec is not None else ()
            tokens, do_sample = (seq.pending, *drafts), True
        else:
            continue
        num_drafts = 0 if seq.is_prefilling else len(tokens) - 1
        slots = 0 if seq.is_prefilling or seq.spec is None else seq.spec.draft_slots
        feed = (*conv.token_ids[conv.draft_cells :], seq.pending) if slots else ()
        work.append(LaneWork(seq.lane, seq.request_id, tokens, start, tuple(conv.table.chunk_ids), do_sample,
                             seq.target_cells, num_drafts, slots, feed, conv.draft_cells if slots else 0))
    return tuple(work)


def commit_work(seqs: Mapping[str, Sequence], work: Iterable[LaneWork], cache: ConversationCache,
                outcomes: Mapping[str, DraftOutcome] | None = None, layout: KVLayout | None = None) -> None:
    """The runner wrote `work`'s cells: each conversation now holds them (and its tokens,
    recorded through the cache so that its prefix index follows); a lane that verified
    drafts holds its fed token and the `accepted` drafts only."""
    for w in work:
        seq = seqs[w.request_id]
        conv = seq.conv
        assert conv.num_cells == w.start, (w.request_id, conv.num_cells, w.start)
        if not seq.is_prefilling:
            assert w.token_ids[0] == seq.pending, (w.request_id, w.token_ids, seq.pending)
            seq.pending = None  # fed: its K/V is written
            if w.num_drafts or w.draft_slots:
                commit_drafts(seq, w, (outcomes or {}).get(w.request_id), cache, layout)
                continue
        cache.extend(conv, w.token_ids)
        conv.table.num_cells = w.num_cells

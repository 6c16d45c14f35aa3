"""Identical full chunks computed at once are held once.

A request forks the longest prefix already held when it is admitted, but two requests
admitted in the same step (or while neither has reached the other's prefix) each
compute their own K/V for the same tokens. When a step's commit completes a chunk, and
another held conversation has the same tokens up to that chunk's end (found through the
cache's prefix index, O(path)), the conversation adopts the other's chunk and frees its
own: the same as a fork would have shared. Pooled layout only; the chunk a conversation
writes next is never touched (only chunks completed by this step, which is over).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from strata.engine.conversation import Sequence
from strata.engine.lanes import Lanes
from strata.kv import table as tbl
from strata.kv import window_table as wt
from strata.step import LaneWork


def adopt_identical_chunks(seqs: Mapping[str, Sequence], work: Iterable[LaneWork], lanes: Lanes) -> int:
    """After `commit_work`: each chunk the step completed gives way to an identical held one.
    Returns how many chunks were adopted (and freed)."""
    cache, layout = lanes.cache, lanes.layout
    if not layout.shares_chunks:
        return 0
    pool, c = layout.pool, layout.chunk_size
    num_adopted = 0
    for w in work:
        seq = seqs.get(w.request_id)
        if seq is None:
            continue
        table = seq.conv.table
        for i in range(w.start // c, table.num_cells // c):  # chunks this step filled up (kept drafts only)
            other = cache.other_holder(seq.conv, (i + 1) * c)
            if other is None:
                break  # nobody shares this chunk's tokens, so nobody shares the next one's either
            for mine, theirs in zip(table.windows, other.table.windows):  # each windowed group's too
                if i < len(theirs.chunk_ids) and wt.adopt(mine, i, theirs.chunk_ids[i]):
                    num_adopted += 1
            if other.table.chunk_ids[i] != table.chunk_ids[i]:
                tbl.adopt(table, pool, i, other.table.chunk_ids[i])
                num_adopted += 1
                if other.draft_cells < (i + 1) * c:  # the adopted chunk's draft-model K/V is not all written
                    seq.conv.draft_cells = min(seq.conv.draft_cells, i * c)
    return num_adopted

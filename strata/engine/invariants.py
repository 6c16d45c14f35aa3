"""The scheduler's invariants, checked by tests after every step (and by `Scheduler.check`).

- the pool's free list and refcounts agree (a scan, not arithmetic on its counters);
- the cache's prefix index holds every conversation's current tokens (tests also compare its
  answers with a brute-force scan: tests/checks.py);
- every held conversation has exactly one cell per listed token, within its table;
- lanes and conversations point at each other consistently; a busy lane's sequence
  extends the lane's conversation;
- pooled: a chunk's refcount equals the number of tables holding it, a session file's in
  flight included (a chunk a save or a restore holds counts as held), and the chunk an
  active conversation writes next is never shared; reserved: no chunk is in two tables;
- session files in flight pin exactly the lanes they name (engine/holds.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from strata.engine.conversation import Sequence as Seq
from strata.engine.holds import SessionHolds
from strata.engine.lanes import Lanes
from strata.kv.table import is_writable
from strata.kv.window_table import is_kept, needed_from


def check_invariants(lanes: Lanes, seqs: Mapping[str, Seq], holds: SessionHolds | None = None) -> None:
    layout, cache = lanes.layout, lanes.cache
    pool = layout.pool
    pool.check()
    cache.check()  # the prefix index agrees with the conversations
    refs: dict[int, int] = {}
    if holds is not None:
        holds.check()
        if layout.shares_chunks:
            for table in holds.tables():
                for i in table.chunk_ids:
                    refs[i] = refs.get(i, 0) + 1
    else:
        assert not any(lane.is_pinned for lane in lanes), "a lane is pinned with no session file in flight"
    for conv in cache:
        assert len(conv.token_ids) == conv.num_cells, (conv.conv_id, len(conv.token_ids), conv.num_cells)
        assert conv.num_cells <= conv.table.cell_capacity(pool.chunk_size)
        if conv.lane is not None:
            assert lanes[conv.lane].conv is conv
        for i in conv.table.chunk_ids:
            refs[i] = refs.get(i, 0) + 1
    for lane in lanes:
        if lane.conv is not None:
            assert lane.conv.lane == lane.index and cache.get(lane.conv.conv_id) is lane.conv
        if lane.seq is not None:
            assert lane.seq.conv is lane.conv and lane.conv.is_active
    for seq in seqs.values():
        assert lanes[seq.lane].seq is seq
    if layout.shares_chunks:
        for i in range(pool.num_total):
            n = refs.get(i, 0)
            assert n == pool.refcount(i), f"chunk {i}: {n} tables, refcount {pool.refcount(i)}"
        for conv in cache:
            if conv.is_active:
                assert is_writable(conv.table, pool), f"conversation {conv.conv_id} writes a shared chunk"
    else:
        assert all(n == 1 for n in refs.values()), "a reserved chunk is in two tables"
    _check_windows(lanes, holds)


def _check_windows(lanes: Lanes, holds: SessionHolds | None) -> None:
    """Each windowed group's pool: refcounts equal the tables listing an id; each table holds
    its next token's window and nothing wholly behind it (kv/window_table.py)."""
    layout = lanes.layout
    tables = [c.table for c in lanes.cache] + (list(holds.tables()) if holds is not None else [])
    for g, pool in enumerate(layout.window_pools):
        pool.check()
        refs: dict[int, int] = {}
        for t in tables:
            for i in t.windows[g].held:
                refs[i] = refs.get(i, 0) + 1
        for i in range(pool.num_total):
            assert refs.get(i, 0) == pool.refcount(i), f"group {g + 1} chunk {i}: {refs.get(i, 0)} tables"
    for conv in lanes.cache:
        t = conv.table
        assert len(t.windows) == len(layout.window_pools)
        for w in t.windows:
            first = needed_from(t.num_cells, w.window, w.pool.chunk_size)
            assert all((w.chunk_ids[j] is None) != is_kept(w, j) for j in range(min(first, len(w.chunk_ids)))), \
                f"conversation {conv.conv_id} holds a passed chunk, or lost a kept window"
        assert layout.windows_held(t, t.num_cells), f"conversation {conv.conv_id} lost its window"

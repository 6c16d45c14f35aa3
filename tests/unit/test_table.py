"""Chunk tables: grow, fork, truncate, the writable invariant, reserved copies (no torch)."""

from __future__ import annotations

import pytest

from strata.kv import table as tbl
from strata.kv.layout import PooledLayout
from strata.kv.pool import KVPool
from strata.kv.reserve import ReservedLayout
from strata.kv.table import CellCopy, ChunkTable


def filled(pool: KVPool, num_cells: int) -> ChunkTable:
    t = ChunkTable()
    tbl.grow(t, pool, num_cells)
    t.num_cells = num_cells
    return t


def refcounts(pool: KVPool) -> list[int]:
    return [pool.refcount(i) for i in range(pool.num_total)]


def test_chunks_for():
    assert [tbl.chunks_for(n, 4) for n in (0, 1, 3, 4, 5, 8, 9)] == [0, 1, 1, 1, 2, 2, 3]


def test_grow_takes_exact_chunk_ids():
    pool = KVPool(8, 4)
    t = ChunkTable()
    assert tbl.num_chunks_to_grow(t, 5, 4) == 2
    tbl.grow(t, pool, 5)
    assert t.chunk_ids == [0, 1]
    assert t.num_cells == 0  # grow makes room, it does not write
    assert tbl.num_chunks_to_grow(t, 8, 4) == 0
    tbl.grow(t, pool, 8)
    assert t.chunk_ids == [0, 1]
    other = filled(pool, 1)
    assert other.chunk_ids == [4]  # a new table starts past half the free run 2..7
    assert tbl.num_chunks_to_grow(t, 9, 4) == 1
    tbl.grow(t, pool, 9)
    assert t.chunk_ids == [0, 1, 2]  # the id after the table's last one was free
    tbl.grow(t, pool, 13)
    assert t.chunk_ids == [0, 1, 2, 3]
    tbl.grow(t, pool, 17)
    assert t.chunk_ids == [0, 1, 2, 3, 6]  # 4 is held: a new run in the free run 5..7
    assert tbl.num_chunks_to_grow(t, 3, 4) == 0  # never shrinks
    assert t.cell_capacity(4) == 20
    assert pool.num_held == 6
    pool.check()


def test_release_frees_the_table():
    pool = KVPool(4, 4)
    t = filled(pool, 10)
    assert t.chunk_ids == [0, 1, 2]
    tbl.release(t, pool)
    assert (t.chunk_ids, t.num_cells) == ([], 0)
    assert pool.num_free == 4
    pool.check()


def test_fork_shares_full_chunks_and_copies_only_the_partial_last_chunk():
    pool = KVPool(8, 4)
    t = filled(pool, 10)
    assert t.chunk_ids == [0, 1, 2]
    assert tbl.num_chunks_to_fork(10, 4) == 1
    f, copies = tbl.fork(t, pool, 10)
    assert f.chunk_ids == [0, 1, 5]  # after 1 comes 2, held: past half the free run 3..7
    assert f.num_cells == 10
    assert copies == [CellCopy(src_chunk=2, dst_chunk=5, start=0, num_cells=2)]
    assert refcounts(pool) == [2, 2, 1, 0, 0, 1, 0, 0]
    assert t.chunk_ids == [0, 1, 2] and t.num_cells == 10  # the original is untouched
    assert tbl.is_writable(t, pool) and tbl.is_writable(f, pool)
    pool.check()


def test_fork_of_a_prefix_inside_a_chunk():
    pool = KVPool(8, 4)
    t = filled(pool, 10)
    f, copies = tbl.fork(t, pool, 6)
    assert f.chunk_ids == [0, 5]
    assert f.num_cells == 6
    assert copies == [CellCopy(1, 5, 0, 2)]
    assert refcounts(pool) == [2, 1, 1, 0, 0, 1, 0, 0]
    pool.check()


def test_fork_at_a_chunk_boundary_copies_nothing():
    pool = KVPool(8, 4)
    t = filled(pool, 10)
    assert tbl.num_chunks_to_fork(8, 4) == 0
    f, copies = tbl.fork(t, pool, 8)
    assert f.chunk_ids == [0, 1]
    assert copies == []
    assert refcounts(pool) == [2, 2, 1, 0, 0, 0, 0, 0]
    assert pool.num_held == 3
    # the fork's next write (position 8) falls in a chunk it does not hold yet: writable
    assert tbl.is_writable(f, pool)
    tbl.grow(f, pool, 9)
    assert f.chunk_ids == [0, 1, 5]  # 2 is the original's
    pool.check()


def test_fork_of_nothing_is_empty():
    pool = KVPool(4, 4)
    t = filled(pool, 5)
    f, copies = tbl.fork(t, pool, 0)
    assert (f.chunk_ids, f.num_cells, copies) == ([], 0, [])
    assert refcounts(pool) == [1, 1, 0, 0]


def test_fork_past_the_table_asserts():
    pool = KVPool(4, 4)
    t = filled(pool, 5)
    with pytest.raises(AssertionError):
        tbl.fork(t, pool, 6)


def test_truncate_frees_trailing_chunks():
    pool = KVPool(8, 4)
    t = filled(pool, 14)
    assert t.chunk_ids == [0, 1, 2, 3]
    assert tbl.num_chunks_to_truncate(t, pool, 6) == 0
    assert tbl.truncate(t, pool, 6) == []
    assert t.chunk_ids == [0, 1]
    assert t.num_cells == 6
    assert refcounts(pool) == [1, 1, 0, 0, 0, 0, 0, 0]
    assert tbl.truncate(t, pool, 4) == []  # to a chunk boundary: the partial chunk goes too
    assert t.chunk_ids == [0]
    assert tbl.truncate(t, pool, 0) == []
    assert t.chunk_ids == [] and pool.num_free == 8
    pool.check()


def test_truncate_into_a_shared_partial_chunk_copies_on_write():
    pool = KVPool(8, 4)
    t = filled(pool, 10)  # [0, 1, 2]
    f, _ = tbl.fork(t, pool, 8)  # shares [0, 1]
    assert refcounts(pool) == [2, 2, 1, 0, 0, 0, 0, 0]
    assert tbl.num_chunks_to_truncate(t, pool, 6) == 1
    copies = tbl.truncate(t, pool, 6)
    # chunk 2 went back to the pool first; the copy follows chunk 0, whose next id is the
    # shared one, so it starts past half the free run 2..7
    assert copies == [CellCopy(src_chunk=1, dst_chunk=4, start=0, num_cells=2)]
    assert t.chunk_ids == [0, 4]
    assert t.num_cells == 6
    assert f.chunk_ids == [0, 1]  # the fork keeps its chunk, now alone
    assert refcounts(pool) == [2, 1, 0, 0, 1, 0, 0, 0]
    assert tbl.is_writable(t, pool) and tbl.is_writable(f, pool)
    pool.check()


def test_truncate_to_a_boundary_of_a_shared_chunk_copies_nothing():
    pool = KVPool(8, 4)
    t = filled(pool, 10)
    f, _ = tbl.fork(t, pool, 8)
    assert tbl.num_chunks_to_truncate(t, pool, 4) == 0
    assert tbl.truncate(t, pool, 4) == []
    assert t.chunk_ids == [0]
    assert f.chunk_ids == [0, 1]
    assert refcounts(pool) == [2, 1, 0, 0, 0, 0, 0, 0]
    pool.check()


def test_truncate_past_the_table_asserts():
    pool = KVPool(4, 4)
    t = filled(pool, 5)
    with pytest.raises(AssertionError):
        tbl.truncate(t, pool, 6)


def test_is_writable():
    pool = KVPool(8, 4)
    t = filled(pool, 6)  # [0, 1], next write in chunk 1
    assert tbl.is_writable(t, pool)
    pool.share([0])
    assert tbl.is_writable(t, pool)  # a shared full chunk is fine
    pool.share([1])
    assert not tbl.is_writable(t, pool)  # the next write's chunk is shared
    t.num_cells = 8  # next write in chunk 2, not held yet
    assert tbl.is_writable(t, pool)
    t.num_cells = 4  # next write in chunk 1 again
    assert not tbl.is_writable(t, pool)
    pool.release([1])
    assert tbl.is_writable(t, pool)


def test_copy_cells_covers_every_cell():
    src = ChunkTable([5, 2, 7], 9)
    dst = ChunkTable([0, 1, 3], 0)
    assert tbl.copy_cells(src, dst, 9, 4) == [CellCopy(5, 0, 0, 4), CellCopy(2, 1, 0, 4), CellCopy(7, 3, 0, 1)]
    assert tbl.copy_cells(src, dst, 8, 4) == [CellCopy(5, 0, 0, 4), CellCopy(2, 1, 0, 4)]
    assert tbl.copy_cells(src, dst, 0, 4) == []


# ---- layouts -----------------------------------------------------------------------------


def test_reserved_layout_reserves_whole_context_per_lane():
    layout = ReservedLayout(num_lanes=3, max_context=10, chunk_size=4)
    assert [t.chunk_ids for t in layout.lane_tables] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert layout.pool.num_free == 0
    assert [layout.num_chunks_in_lane(i, None) for i in range(3)] == [3, 3, 3]
    t = layout.new_table(1)
    assert t is layout.lane_tables[1]
    assert layout.num_chunks_to_grow(t, 12) == 0
    layout.grow(t, 12)
    assert t.chunk_ids == [3, 4, 5]
    with pytest.raises(AssertionError):
        layout.grow(t, 13)  # past the lane's reservation
    assert layout.num_freed_by_release([t]) == 0


def test_reserved_move_copies_every_cell():
    layout = ReservedLayout(num_lanes=2, max_context=12, chunk_size=4)
    src = layout.new_table(0)
    src.num_cells = 10
    dst, copies = layout.move(src, 1)
    assert dst is layout.lane_tables[1]
    assert copies == [CellCopy(0, 3, 0, 4), CellCopy(1, 4, 0, 4), CellCopy(2, 5, 0, 2)]
    assert (dst.num_cells, src.num_cells) == (10, 0)
    with pytest.raises(AssertionError):
        layout.new_table(1)  # lane 1 holds the moved conversation now


def test_reserved_fork_copies_the_prefix_into_the_lane():
    layout = ReservedLayout(num_lanes=2, max_context=12, chunk_size=4)
    src = layout.new_table(1)
    src.num_cells = 11
    dst, copies = layout.fork(src, 5, 0)
    assert dst is layout.lane_tables[0]
    assert dst.num_cells == 5 and src.num_cells == 11
    assert copies == [CellCopy(3, 0, 0, 4), CellCopy(4, 1, 0, 1)]
    assert layout.num_chunks_to_fork(5) == 0
    assert layout.truncate(src, 3) == [] and src.num_cells == 3
    layout.release(src)
    assert src.num_cells == 0 and src.chunk_ids == [3, 4, 5]  # the lane keeps its reservation
    assert layout.pool.num_held == 6


def test_pooled_layout_move_is_a_handover():
    layout = PooledLayout(4, 4)
    t = ChunkTable()
    layout.grow(t, 6)
    t.num_cells = 6
    moved, copies = layout.move(t, 3)
    assert moved is t and copies == []
    assert layout.num_chunks_in_lane(3, t) == 2 and layout.num_chunks_in_lane(0, None) == 0


def test_pooled_layout_num_freed_by_release_over_tables():
    layout = PooledLayout(8, 4)
    t = ChunkTable()
    layout.grow(t, 10)
    t.num_cells = 10
    f, _ = layout.fork(t, 9, 1)
    assert f.chunk_ids == [0, 1, 5]
    assert layout.num_freed_by_release([t]) == 1  # only chunk 2 is its own
    assert layout.num_freed_by_release([f]) == 1  # only chunk 5
    assert layout.num_freed_by_release([t, f]) == 4
    layout.release(t)
    assert layout.num_freed_by_release([f]) == 3


def test_a_fork_or_truncate_the_pool_cannot_hold_changes_nothing():
    from strata.errors import PoolExhausted

    pool = KVPool(3, 4)
    t = filled(pool, 10)  # chunks [0, 1, 2], the pool is full
    before = (refcounts(pool), list(t.chunk_ids), t.num_cells)
    with pytest.raises(PoolExhausted):
        tbl.fork(t, pool, 6)  # would share chunk 0 and needs a chunk for the partial one
    assert (refcounts(pool), list(t.chunk_ids), t.num_cells) == before

    f, _ = tbl.fork(t, pool, 8)  # full chunks only: shares 0 and 1
    before = (refcounts(pool), list(f.chunk_ids), f.num_cells)
    with pytest.raises(PoolExhausted):
        tbl.truncate(f, pool, 6)  # copy-on-write of chunk 1 with nothing free
    assert (refcounts(pool), list(f.chunk_ids), f.num_cells) == before

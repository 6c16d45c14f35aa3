"""KVPool: the only code that hands out, shares and frees chunk ids (no torch)."""

from __future__ import annotations

import pytest

from strata.errors import ChunkNotHeld, PoolError, PoolExhausted
from strata.kv.pool import KVPool


def state(pool: KVPool) -> tuple:
    """The whole pool, read independently of its counters."""
    return tuple(pool.refcount(i) for i in range(pool.num_total)), pool.free_ids(), pool.num_held


def test_new_pool_is_all_free():
    pool = KVPool(5, 4)
    assert (pool.num_total, pool.num_free, pool.num_held, pool.chunk_size) == (5, 5, 0, 4)
    assert pool.num_cells_total == 20
    assert [pool.refcount(i) for i in range(5)] == [0, 0, 0, 0, 0]
    pool.check()


@pytest.mark.parametrize("num_chunks, chunk_size", [(0, 4), (4, 0), (-1, 4)])
def test_empty_pool_is_an_error(num_chunks, chunk_size):
    with pytest.raises(ValueError):
        KVPool(num_chunks, chunk_size)


def test_placement_exact_ids():
    pool = KVPool(6, 4)
    assert pool.allocate(3) == [0, 1, 2]  # the free run 0..5 starts at id 0: from its start
    # a new table: the free run 3..5 follows a held chunk, so it starts past half of its
    # 2 spare ids, leaving id 3 for the table before it to grow into
    assert pool.allocate(1) == [4]
    assert pool.release([2, 0]) == 2
    assert pool.free_ids() == [0, 2, 3, 5]
    assert pool.allocate(1, after=1) == [2]  # the id right after the table's last one is free
    # free runs [0], [3], [5]: the lowest of the largest, then each next id is held, so
    # each chunk starts a run of its own
    assert pool.allocate(3) == [0, 3, 5]
    assert pool.num_free == 0 and pool.num_held == 6
    pool.check()


def test_two_long_tables_grow_contiguously():
    """The pool decode benchmark's shape: two lanes of 8 chunks in 18, each then growing
    one chunk at a time in turn; neither table's ids ever break into a second run."""
    pool = KVPool(18, 4)
    a = pool.allocate(8)
    b = pool.allocate(8)
    assert a == list(range(0, 8))
    assert b == list(range(9, 17))  # 10 free ids after a: one spare id for a, one for b
    a += pool.allocate(1, after=a[-1])
    b += pool.allocate(1, after=b[-1])
    assert a == list(range(0, 9)) and b == list(range(9, 18))
    pool.check()


def test_new_tables_spread_out_evenly():
    pool = KVPool(16, 4)
    # each first chunk halves the largest free run (the lowest of equals): an even grid
    assert [pool.allocate(1) for _ in range(4)] == [[0], [8], [4], [12]]
    assert pool.allocate(1, after=0) == [1]
    assert pool.allocate(2, after=8) == [9, 10]
    pool.check()


def test_growth_past_a_held_id_starts_a_new_run():
    pool = KVPool(12, 4)
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(2) == [6, 7]  # free run 2..11: 8 spare ids, 4 before it
    assert pool.allocate(5, after=1) == [2, 3, 4, 5, 9]  # 6 is held: the rest goes to the run 8..11
    # a request larger than every free run takes the largest whole, then the next largest
    assert pool.allocate(3) == [10, 11, 8]
    assert pool.num_free == 0
    pool.check()


def test_allocate_after_an_unknown_id_raises_before_taking_any():
    pool = KVPool(4, 4)
    pool.allocate(1)
    before = state(pool)
    for bad in (-1, 4, "1"):
        with pytest.raises(PoolError, match="allocate after chunk"):
            pool.allocate(1, after=bad)
    assert state(pool) == before
    assert pool.allocate(1, after=3) == [2]  # the last id has no next: a new run
    pool.check()


def test_allocate_sets_refcount_one_and_counts():
    pool = KVPool(4, 2)
    ids = pool.allocate(2)
    assert [pool.refcount(i) for i in range(4)] == [1, 1, 0, 0]
    assert (pool.num_held, pool.num_free) == (2, 2)
    assert not pool.is_shared(ids[0])
    assert pool.can_allocate(2) and not pool.can_allocate(3)
    pool.check()


def test_allocate_past_free_raises_before_taking_any():
    pool = KVPool(2, 4)
    pool.allocate(1)
    before = state(pool)
    with pytest.raises(PoolExhausted, match="asked for 2 chunks with 1 free"):
        pool.allocate(2)
    with pytest.raises(PoolExhausted):
        pool.allocate(-1)
    assert state(pool) == before
    pool.check()


def test_share_and_release_refcounts():
    pool = KVPool(4, 4)
    assert pool.allocate(2) == [0, 1]
    pool.share([0])
    pool.share([0, 1])
    assert (pool.refcount(0), pool.refcount(1)) == (3, 2)
    assert pool.is_shared(0) and pool.is_shared(1)
    assert (pool.num_held, pool.num_free) == (2, 2)  # sharing takes no new chunk

    assert pool.release([0, 1]) == 0
    assert (pool.refcount(0), pool.refcount(1)) == (2, 1)
    assert not pool.is_shared(1)
    assert pool.release([1]) == 1
    assert pool.refcount(1) == 0 and pool.num_free == 3
    assert pool.release([0, 0]) == 1  # a duplicate in one call drops two holders
    assert pool.refcount(0) == 0
    assert (pool.num_held, pool.num_free) == (0, 4)
    pool.check()


def test_num_freed_by_release_counts_duplicates_and_shared_chunks():
    pool = KVPool(6, 4)
    assert pool.allocate(4) == [0, 1, 2, 3]
    pool.share([0, 1])  # 0 and 1 have two holders, 2 and 3 one
    before = [pool.refcount(i) for i in range(6)]

    assert pool.num_freed_by_release([]) == 0
    assert pool.num_freed_by_release([2]) == 1
    assert pool.num_freed_by_release([0]) == 0  # still held by its other holder
    assert pool.num_freed_by_release([0, 0]) == 1  # both holders go
    assert pool.num_freed_by_release([0, 2, 3]) == 2
    assert pool.num_freed_by_release([0, 1, 0, 2, 1]) == 3  # two tables sharing 0 and 1, plus 2
    assert pool.num_freed_by_release([0, 1, 2, 3]) == 2
    # nothing changed
    assert [pool.refcount(i) for i in range(6)] == before
    assert (pool.num_held, pool.num_free) == (4, 2)
    # and it agrees with what release actually does
    assert pool.release([0, 1, 0, 2, 1]) == 3
    pool.check()


def test_release_of_a_free_chunk_raises_before_changing_anything():
    pool = KVPool(3, 4)
    pool.allocate(2)
    before = state(pool)
    with pytest.raises(ChunkNotHeld, match="release of chunk 2"):
        pool.release([0, 2])  # 0 is held, 2 is not: neither is released
    assert state(pool) == before
    assert pool.release([0]) == 1
    with pytest.raises(ChunkNotHeld, match="release of chunk 0"):
        pool.release([0])  # a double release
    assert pool.refcount(0) == 0 and pool.free_ids() == [0, 2]
    pool.check()


def test_release_more_holders_than_there_are_raises():
    pool = KVPool(3, 4)
    pool.allocate(1)
    before = state(pool)
    with pytest.raises(ChunkNotHeld, match="2 time"):
        pool.release([0, 0])
    assert state(pool) == before


def test_share_of_a_free_or_unknown_chunk_raises_before_changing_anything():
    pool = KVPool(3, 4)
    pool.allocate(1)
    before = state(pool)
    with pytest.raises(ChunkNotHeld, match="share of chunk 1"):
        pool.share([0, 1])
    with pytest.raises(PoolError, match="ids are 0..2"):
        pool.share([7])
    with pytest.raises(PoolError):
        pool.release([-1])
    assert state(pool) == before


def test_contracts_hold_under_python_O(tmp_path):
    """The checks are exceptions, not asserts: `python -O` keeps them."""
    import subprocess
    import sys

    code = (
        "from strata.kv.pool import KVPool\n"
        "from strata.errors import PoolError\n"
        "p = KVPool(2, 1); p.allocate(1)\n"
        "for f in (lambda: p.allocate(2), lambda: p.release([1]), lambda: p.release([0, 0])):\n"
        "    try:\n        f()\n        raise SystemExit('no error')\n"
        "    except PoolError:\n        pass\n"
        "p.check()\n"
        "print('ok', p.num_free, p.refcount(0))\n"
    )
    run = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["ok", "1", "1"]


def test_check_catches_corruption():
    pool = KVPool(4, 4)
    pool.allocate(2)
    pool.check()

    bad = KVPool(4, 4)
    bad.allocate(2)
    bad._refcounts[3] = 1  # held behind the pool's back: still on the free list
    with pytest.raises(PoolError, match="free list"):
        bad.check()

    bad = KVPool(4, 4)
    bad.allocate(2)
    bad.num_held = 1  # counted wrong
    with pytest.raises(PoolError, match="num_held"):
        bad.check()

    bad = KVPool(4, 4)
    bad.allocate(2)
    bad._refcounts[0] = 0  # freed without going back on the free list
    with pytest.raises(PoolError, match="free list"):
        bad.check()

    bad = KVPool(4, 4)
    bad.allocate(2)
    bad._free.append(3)  # on the free list twice: free + held would still add up to 5
    with pytest.raises(PoolError, match="twice"):
        bad.check()

    bad = KVPool(4, 4)
    bad.allocate(2)
    bad._free.pop()  # a free id lost: the counters alone cannot see it
    with pytest.raises(PoolError, match="free list"):
        bad.check()

    bad = KVPool(4, 4)
    bad.allocate(1)
    bad._free.reverse()  # placement reads free runs off the ascending list
    with pytest.raises(PoolError, match="out of order"):
        bad.check()


def test_free_plus_held_is_total_through_a_sequence():
    pool = KVPool(8, 2)
    a = pool.allocate(3)
    b = pool.allocate(2)
    pool.share(a[:2])
    for ids in (a, b[:1], a[:2], b[1:]):
        pool.release(ids)
        assert pool.num_free + pool.num_held == pool.num_total
        pool.check()
    assert pool.num_free == 8
    assert pool.allocate(8) == list(range(8))


def test_chunk_owners_maps_each_held_id_to_the_tables_listing_it_and_changes_nothing():
    pool = KVPool(6, 4)
    a = pool.allocate(3)  # [0, 1, 2]
    b = pool.allocate(1)  # [4]: a new table starts halfway into the free run 3..5
    pool.share(a[:2])  # b's table starts with a's first two chunks
    owners = pool.chunk_owners([("a", a), ("b", a[:2] + b)])
    assert owners == {0: ["a", "b"], 1: ["a", "b"], 2: ["a"], 4: ["b"]}
    assert [pool.refcount(i) for i in range(6)] == [2, 2, 1, 0, 1, 0]
    assert pool.free_ids() == [3, 5]
    with pytest.raises(ChunkNotHeld):
        pool.chunk_owners([("stale", [3])])  # a table listing a free chunk is a caller's bug
    pool.check()

"""The pool of chunk ids: the only code that hands out, shares and frees them.

Imports no torch: the storage a chunk id points at lives in `kv.storage`, and every
layer's storage uses the same id for the same slot.

Contracts: `allocate` beyond the free chunks, and `share` or `release` of a chunk
with too few holders, raise a `PoolError` before anything changes, so a caller's bug
can neither leak ids nor drive a refcount negative (under `python -O` too).

Invariants (checked by `check`, by scanning, not by arithmetic on the counters):
- the free list holds each id at most once, and exactly the ids whose refcount is 0;
- `num_held` counts the ids whose refcount is above 0, so free + held == total;
- placement is deterministic (a function of the free ids and the hint), so tests can
  assert exact ids.

Placement keeps each table's chunks in few contiguous runs, because attention reads a
lane whose cells are one run of storage in place, and two such lanes evenly spaced
through one strided view (runner/reads.py): a table grows into the chunk right after
its last one when that is free (`after`); a table's first chunk, or a run that cannot
continue, starts in the largest free run of ids: at its start when id 0 begins it,
else past half its spare ids, so that the table before it (which grows to the right)
and the new one each keep half the room to grow contiguously.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

from strata.errors import ChunkNotHeld, PoolError, PoolExhausted


class KVPool:
    def __init__(self, num_chunks: int, chunk_size: int):
        if num_chunks < 1 or chunk_size < 1:
            raise ValueError(f"a pool needs at least one chunk of one cell, got {num_chunks}x{chunk_size}")
        self.num_total = num_chunks
        self.chunk_size = chunk_size
        self._refcounts = [0] * num_chunks
        self._free: list[int] = list(range(num_chunks))  # the free ids, ascending
        self.num_held = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cells_total(self) -> int:
        return self.num_total * self.chunk_size

    def can_allocate(self, num_chunks: int) -> bool:
        return num_chunks <= self.num_free

    def allocate(self, num_chunks: int, after: int | None = None) -> list[int]:
        """Hand out `num_chunks` ids with refcount 1, for a table whose last chunk is
        `after` (None: a new table), placed as the module docstring says."""
        if not 0 <= num_chunks <= self.num_free:
            raise PoolExhausted(num_chunks, self.num_free)
        if after is not None and not (isinstance(after, int) and 0 <= after < self.num_total):
            raise PoolError(f"allocate after chunk {after!r}: ids are 0..{self.num_total - 1}")
        ids: list[int] = []
        while len(ids) < num_chunks:
            last = ids[-1] if ids else after
            if last is not None and last + 1 < self.num_total and self._refcounts[last + 1] == 0:
                take = [last + 1]
            else:
                take = self._new_run(num_chunks - len(ids))
            for i in take:
                del self._free[bisect.bisect_left(self._free, i)]
                self._refcounts[i] = 1
            ids += take
        self.num_held += num_chunks
        return ids

    def _new_run(self, num_chunks: int) -> list[int]:
        """Up to `num_chunks` consecutive free ids in the largest free run (the lowest of
        equals): from its start when it starts at id 0, else past half its spare ids."""
        best_start, best_len = 0, 0
        start = prev = self._free[0]
        for i in self._free[1:] + [-1]:  # -1 closes the last run
            if i != prev + 1:
                if prev + 1 - start > best_len:
                    best_start, best_len = start, prev + 1 - start
                start = i
            prev = i
        n = min(num_chunks, best_len)
        first = best_start if best_start == 0 else best_start + (best_len - n) // 2
        return list(range(first, first + n))

    def share(self, ids: Iterable[int]) -> None:
        """One more holder for each of `ids` (a forked table shares full chunks)."""
        ids = list(ids)
        for i in ids:
            self._check_held("share", i, 1)
        for i in ids:
            self._refcounts[i] += 1

    def release(self, ids: Iterable[int]) -> int:
        """One holder fewer for each of `ids` (an id may repeat); returns how many became free."""
        counts = Counter(ids)
        for i, n in counts.items():
            self._check_held("release", i, n)
        num_freed = 0
        for i, n in counts.items():
            self._refcounts[i] -= n
            if self._refcounts[i] == 0:
                bisect.insort(self._free, i)
                num_freed += 1
        self.num_held -= num_freed
        return num_freed

    def _check_held(self, operation: str, chunk_id: int, times: int) -> None:
        if not (isinstance(chunk_id, int) and 0 <= chunk_id < self.num_total):
            raise PoolError(f"{operation} of chunk {chunk_id!r}: ids are 0..{self.num_total - 1}")
        if self._refcounts[chunk_id] < times:
            raise ChunkNotHeld(operation, chunk_id, self._refcounts[chunk_id], times)

    def refcount(self, chunk_id: int) -> int:
        return self._refcounts[chunk_id]

    def is_shared(self, chunk_id: int) -> bool:
        return self._refcounts[chunk_id] > 1

    def free_ids(self) -> list[int]:
        """The free list, lowest first (a copy)."""
        return list(self._free)

    def chunk_owners(self, tables: Iterable[tuple[K, Sequence[int]]]) -> dict[int, list[K]]:
        """Read-only: each held chunk id -> the keys of the `(key, chunk ids)` tables that list it,
        in the order given. Every id a table lists must be held here (PoolError otherwise);
        nothing is changed."""
        owners: dict[int, list[K]] = {}
        for key, ids in tables:
            for i in ids:
                self._check_held("chunk_owners", i, 1)
                owners.setdefault(i, []).append(key)
        return owners

    def num_freed_by_release(self, ids: Iterable[int]) -> int:
        """How many chunks releasing `ids` once would free (nothing is changed)."""
        return sum(1 for i, n in Counter(ids).items() if self._refcounts[i] == n)

    def check(self) -> None:
        """Raises PoolError naming the first broken invariant (tests call it after each step)."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise PoolError("an id is on the free list twice")
        if self._free != sorted(free):
            raise PoolError("the free list is out of order")
        zero = {i for i, c in enumerate(self._refcounts) if c == 0}
        if free != zero:
            raise PoolError(f"free list != refcount-0 ids: {sorted(free ^ zero)[:8]} differ")
        if any(c < 0 for c in self._refcounts):
            raise PoolError("a refcount is negative")
        held = self.num_total - len(zero)
        if held != self.num_held:
            raise PoolError(f"{held} ids have holders but num_held is {self.num_held}")

"""The pool of chunk ids: the only code that hands out, shares and frees them.

Imports no torch: the storage a chunk id points at lives in `kv.storage`, and every
layer's storage uses the same id for the same slot.

Contracts: `allocate` beyond the free chunks, and `share` or `release` of a chunk
with too few holders, raise a `PoolError` before anything changes, so a caller's bug
can neither leak ids nor drive a refcount negative (under `python -O` too).

Invariants (checked by `check`, by scanning, not by arithmetic on the counters):
- the free list holds each id at most once, and exactly the ids whose refcount is 0;
- `num_held` counts the ids whose refcount is above 0, so free + held == total;
- ids are handed out lowest first, so tests can assert exact ids.
"""

from __future__ import annotations

import heapq
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
        self._free: list[int] = list(range(num_chunks))  # a heap of free ids
        self.num_held = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cells_total(self) -> int:
        return self.num_total * self.chunk_size

    def can_allocate(self, num_chunks: int) -> bool:
        return num_chunks <= self.num_free

    def allocate(self, num_chunks: int) -> list[int]:
        """Hand out `num_chunks` ids with refcount 1 (lowest first)."""
        if not 0 <= num_chunks <= self.num_free:
            raise PoolExhausted(num_chunks, self.num_free)
        ids = [heapq.heappop(self._free) for _ in range(num_chunks)]
        for i in ids:
            self._refcounts[i] = 1
        self.num_held += num_chunks
        return ids

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
                heapq.heappush(self._free, i)
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
        return sorted(self._free)

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
        zero = {i for i, c in enumerate(self._refcounts) if c == 0}
        if free != zero:
            raise PoolError(f"free list != refcount-0 ids: {sorted(free ^ zero)[:8]} differ")
        if any(c < 0 for c in self._refcounts):
            raise PoolError("a refcount is negative")
        held = self.num_total - len(zero)
        if held != self.num_held:
            raise PoolError(f"{held} ids have holders but num_held is {self.num_held}")

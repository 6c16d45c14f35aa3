"""The pool of chunk ids: the only code that hands out, shares and frees them.

Imports no torch: the storage a chunk id points at lives in `kv.storage`, and every
layer's storage uses the same id for the same slot.

Invariants (checked by `check`):
- `num_free + num_held == num_total`;
- a chunk is free exactly when its refcount is 0;
- ids are handed out lowest first, so tests can assert exact ids.
"""

from __future__ import annotations

import heapq


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
        return self.num_total - self.num_held

    @property
    def num_cells_total(self) -> int:
        return self.num_total * self.chunk_size

    def can_allocate(self, num_chunks: int) -> bool:
        return num_chunks <= self.num_free

    def allocate(self, num_chunks: int) -> list[int]:
        """Hand out `num_chunks` ids with refcount 1; the caller checked `can_allocate`."""
        assert num_chunks <= self.num_free, f"allocate({num_chunks}) with {self.num_free} free"
        ids = [heapq.heappop(self._free) for _ in range(num_chunks)]
        for i in ids:
            self._refcounts[i] = 1
        self.num_held += num_chunks
        return ids

    def share(self, ids: list[int]) -> None:
        """One more holder for each of `ids` (a forked table shares full chunks)."""
        for i in ids:
            assert self._refcounts[i] > 0, f"share of free chunk {i}"
            self._refcounts[i] += 1

    def release(self, ids: list[int]) -> int:
        """One holder fewer for each of `ids`; returns how many chunks became free."""
        num_freed = 0
        for i in ids:
            assert self._refcounts[i] > 0, f"release of free chunk {i}"
            self._refcounts[i] -= 1
            if self._refcounts[i] == 0:
                heapq.heappush(self._free, i)
                num_freed += 1
        self.num_held -= num_freed
        return num_freed

    def refcount(self, chunk_id: int) -> int:
        return self._refcounts[chunk_id]

    def is_shared(self, chunk_id: int) -> bool:
        return self._refcounts[chunk_id] > 1

    def num_freed_by_release(self, ids: list[int]) -> int:
        """How many chunks releasing `ids` once would free (nothing is changed)."""
        counts: dict[int, int] = {}
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
        return sum(1 for i, n in counts.items() if self._refcounts[i] == n)

    def check(self) -> None:
        held = sum(1 for c in self._refcounts if c > 0)
        assert held == self.num_held, f"held {held} != counted {self.num_held}"
        assert len(self._free) == self.num_free, f"free list {len(self._free)} != {self.num_free}"
        assert self.num_free + self.num_held == self.num_total
        assert all(self._refcounts[i] == 0 for i in self._free)

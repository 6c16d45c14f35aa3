"""How conversations hold K/V: the interface both layouts share, and the pooled one.

The scheduler speaks to a layout, never to chunk ids directly:
- `PooledLayout` (`--kv-pool-tokens N`): a conversation holds only the chunks it has
  reached; a move between lanes hands its table over (no K/V copied); a conversation
  can stay parked in the pool without a lane.
- `ReservedLayout` (kv/reserve.py, the default): each lane owns chunks for the whole
  `--max-context`; a move copies K/V into the destination lane's chunks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from strata.kv import table as tbl
from strata.kv.pool import KVPool
from strata.kv.table import CellCopy, ChunkTable


class KVLayout(ABC):
    pool: KVPool
    name: str  # "pooled" | "reserved": what /slots and the Monitor show
    # A conversation may be held without a lane (parked in the pool); else it lives in its
    # lane's reservation, and one that leaves its lane is evicted.
    holds_parked: bool
    # A move between lanes copies K/V (else it hands the table over).
    moves_copy: bool
    # A chunk id may be listed by several tables (forks share full chunks; identical chunks
    # are adopted); else every chunk belongs to one lane's reservation.
    shares_chunks: bool

    @property
    def chunk_size(self) -> int:
        return self.pool.chunk_size

    @abstractmethod
    def new_table(self, lane: int) -> ChunkTable:
        """An empty table for a new conversation in `lane` (which holds nothing now)."""

    @abstractmethod
    def move(self, table: ChunkTable, dst_lane: int) -> tuple[ChunkTable, list[CellCopy]]:
        """The conversation holding `table` goes to `dst_lane` (which holds nothing now)."""

    @abstractmethod
    def fork(self, table: ChunkTable, num_cells: int, dst_lane: int) -> tuple[ChunkTable, list[CellCopy]]:
        """A new conversation in `dst_lane` starting with the first `num_cells` cells of `table`."""

    @abstractmethod
    def num_chunks_to_fork(self, num_cells: int) -> int: ...

    @abstractmethod
    def num_chunks_to_grow_from(self, num_chunks_held: int, num_cells: int) -> int:
        """New chunks a table holding `num_chunks_held` needs to reach `num_cells` cells."""

    def num_chunks_to_grow(self, table: ChunkTable, num_cells: int) -> int:
        return self.num_chunks_to_grow_from(len(table.chunk_ids), num_cells)

    @abstractmethod
    def grow(self, table: ChunkTable, num_cells: int) -> None:
        """Room for `num_cells` cells; the caller checked the pool has it."""

    @abstractmethod
    def num_chunks_to_truncate(self, table: ChunkTable, num_cells: int) -> int: ...

    @abstractmethod
    def truncate(self, table: ChunkTable, num_cells: int) -> list[CellCopy]: ...

    @abstractmethod
    def num_freed_by_truncate(self, table: ChunkTable, num_cells: int) -> int:
        """Chunks truncating `table` to `num_cells` would free (nothing is changed)."""

    @abstractmethod
    def release(self, table: ChunkTable) -> None:
        """The conversation holding `table` is gone."""

    @abstractmethod
    def num_freed_by_release(self, tables: Iterable[ChunkTable]) -> int:
        """How many chunks releasing all of `tables` would free (nothing is changed)."""

    @abstractmethod
    def num_chunks_in_lane(self, lane: int, table: ChunkTable | None) -> int:
        """Chunks lane `lane` holds while it has `table` (None: an empty lane)."""

    def reserved_chunks(self) -> list[int]:
        """Chunk ids held by lanes' reservations whether written or not (none when pooled)."""
        return []


class PooledLayout(KVLayout):
    name = "pooled"
    holds_parked = True
    moves_copy = False
    shares_chunks = True

    def __init__(self, num_chunks: int, chunk_size: int):
        self.pool = KVPool(num_chunks, chunk_size)

    def new_table(self, lane: int) -> ChunkTable:
        return ChunkTable()

    def move(self, table: ChunkTable, dst_lane: int) -> tuple[ChunkTable, list[CellCopy]]:
        return table, []  # a swap of chunk tables: the K/V stays where it is

    def fork(self, table: ChunkTable, num_cells: int, dst_lane: int) -> tuple[ChunkTable, list[CellCopy]]:
        return tbl.fork(table, self.pool, num_cells)

    def num_chunks_to_fork(self, num_cells: int) -> int:
        return tbl.num_chunks_to_fork(num_cells, self.chunk_size)

    def num_chunks_to_grow_from(self, num_chunks_held: int, num_cells: int) -> int:
        return max(0, tbl.chunks_for(num_cells, self.chunk_size) - num_chunks_held)

    def grow(self, table: ChunkTable, num_cells: int) -> None:
        tbl.grow(table, self.pool, num_cells)

    def num_chunks_to_truncate(self, table: ChunkTable, num_cells: int) -> int:
        return tbl.num_chunks_to_truncate(table, self.pool, num_cells)

    def truncate(self, table: ChunkTable, num_cells: int) -> list[CellCopy]:
        return tbl.truncate(table, self.pool, num_cells)

    def num_freed_by_truncate(self, table: ChunkTable, num_cells: int) -> int:
        return self.pool.num_freed_by_release(table.chunk_ids[tbl.chunks_for(num_cells, self.chunk_size) :])

    def release(self, table: ChunkTable) -> None:
        tbl.release(table, self.pool)

    def num_freed_by_release(self, tables: Iterable[ChunkTable]) -> int:
        return self.pool.num_freed_by_release([i for t in tables for i in t.chunk_ids])

    def num_chunks_in_lane(self, lane: int, table: ChunkTable | None) -> int:
        return 0 if table is None else len(table.chunk_ids)

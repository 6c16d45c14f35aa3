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
from collections.abc import Iterable, Sequence

from strata.kv import table as tbl
from strata.kv import window_table as wt
from strata.kv.pool import KVPool
from strata.kv.table import CellCopy, ChunkTable
from strata.kv.window_table import WindowIds


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
    # The windowed layer groups' pools (kv/groups.py), groups 1..; empty: one group, `pool`.
    window_pools: tuple[KVPool, ...] = ()
    windows: tuple[int, ...] = ()  # each windowed group's window, in group order

    @property
    def chunk_size(self) -> int:
        return self.pool.chunk_size

    # ---- windowed groups (no-ops with one group) ---------------------------------------
    def num_window_chunks_to_grow(self, table: ChunkTable, num_cells: int,
                                  held: int | None = None) -> tuple[int, ...]:
        """Per windowed group: new chunks for a step that writes `table`'s cells up to `num_cells`
        (`held`: the cells whose window starts the room, the table's by default)."""
        held = table.num_cells if held is None else held
        return tuple(wt.num_to_grow(w, held, num_cells) for w in table.windows)

    def grow_windows(self, table: ChunkTable, num_cells: int, held: int | None = None) -> None:
        """Room in every windowed group for the cells up to `num_cells`, from the window of `held`
        cells on (the table's; a restore's whole length: its last window only); the caller made it."""
        held = table.num_cells if held is None else held
        for w in table.windows:
            wt.grow(w, held, num_cells)

    def num_window_chunks_to_fork(self, table: ChunkTable, num_cells: int) -> tuple[int, ...]:
        return tbl.num_window_chunks_to_fork(table, num_cells)

    def num_window_chunks_to_truncate(self, table: ChunkTable, num_cells: int) -> tuple[int, ...]:
        return tbl.num_window_chunks_to_truncate(table, num_cells)

    def num_window_chunks_freed(self, tables: Iterable[ChunkTable]) -> tuple[int, ...]:
        """Per windowed group: chunks releasing all of `tables` would free (nothing is changed)."""
        tables = list(tables)
        return tuple(pool.num_freed_by_release([i for t in tables for i in t.windows[g].held])
                     for g, pool in enumerate(self.window_pools))

    def keep_windows(self, table: ChunkTable, positions: Sequence[int]) -> None:
        """Keep the window before each of `positions` (a checkpoint, a prompt's end) in every
        windowed group while the conversation is held (kv/window_table.py)."""
        for w in table.windows:
            wt.keep(w, list(positions), table.num_cells)

    def keep_windows_ahead(self, table: ChunkTable, positions: Sequence[int]) -> None:
        """`keep_windows` for a new table whose cells are written next (a restore)."""
        for w in table.windows:
            wt.keep_ahead(w, list(positions))

    def num_window_chunks_kept(self, tables: Iterable[ChunkTable]) -> tuple[int, ...]:
        """Per windowed group: chunks dropping the kept windows of `tables` would free."""
        tables = list(tables)
        return tuple(pool.num_freed_by_release([i for t in tables for i in wt.kept_only(t.windows[g], t.num_cells)])
                     for g, pool in enumerate(self.window_pools))

    def keep_window_only(self, table: ChunkTable, position: int) -> None:
        """Every kept window of `table` gives way but the one before `position`."""
        for w in table.windows:
            wt.keep_only(w, position, table.num_cells)

    def drop_kept_windows(self, table: ChunkTable) -> None:
        for w in table.windows:
            wt.drop_kept(w, table.num_cells)

    def reusable(self, table: ChunkTable, num_cells: int) -> int:
        """The longest prefix of `table`, at most `num_cells`, that every windowed group can go on
        from (its window held); `num_cells` itself with one group."""
        return wt.reusable(table.windows, num_cells) if table.windows else num_cells

    def windows_held(self, table: ChunkTable, num_cells: int) -> bool:
        return tbl.windows_held(table, num_cells)

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

    def __init__(self, num_chunks: int, chunk_size: int, windows: Sequence[tuple[int, int]] = ()):
        """`windows`: (window, chunks) of each windowed layer group, in group order (kv/groups.py)."""
        self.pool = KVPool(num_chunks, chunk_size)
        self.windows = tuple(w for w, _ in windows)
        self.window_pools = tuple(KVPool(n, chunk_size) for _, n in windows)

    def new_table(self, lane: int) -> ChunkTable:
        return ChunkTable(windows=[WindowIds(pool, w, g + 1, [])
                                   for g, (w, pool) in enumerate(zip(self.windows, self.window_pools))])

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

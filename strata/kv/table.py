"""Chunk tables: a conversation's ordered chunk ids plus its length in cells.

A table is the only map from token position to storage: position `p` lives in cell
`p % chunk_size` of chunk `chunk_ids[p // chunk_size]`. Operations here go through
the pool for every id they take or give back, and describe the K/V copies they need
as `CellCopy` records (the storage runs them); no torch here.

Invariants:
- `len(chunk_ids) * chunk_size >= num_cells`;
- the chunk that position `num_cells` falls in (the next write) is never shared:
  full chunks may be shared by forks, a partial last chunk is always private.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.errors import PoolExhausted
from strata.kv import window_table as wt
from strata.kv.pool import KVPool
from strata.kv.window_table import WindowIds


@dataclass(frozen=True)
class CellCopy:
    """Copy cells [start, start + num_cells) of one chunk into the same cells of another."""

    src_chunk: int
    dst_chunk: int
    start: int
    num_cells: int
    group: int = 0  # the layer group whose chunks these are (kv/groups.py; 0: full attention)


@dataclass(eq=False)
class ChunkTable:
    """`num_cells` changes only through `append_cells` and the operations of this module and
    the layouts (grow, truncate, fork, release); `num_cells <= cell_capacity` (checked by the
    scheduler's invariants)."""

    chunk_ids: list[int] = field(default_factory=list)
    num_cells: int = 0
    # The windowed layer groups' chunks (kv/window_table.py), one per group 1..; empty: one group
    windows: list[WindowIds] = field(default_factory=list)

    def cell_capacity(self, chunk_size: int) -> int:
        return len(self.chunk_ids) * chunk_size

    def append_cells(self, num_cells: int) -> None:
        """`num_cells` more cells after the table's last hold written K/V (room was grown for them)."""
        assert num_cells >= 0
        self.num_cells += num_cells
        for w in self.windows:  # the window of the next token moved: what is behind it goes
            wt.pass_window(w, self.num_cells)


def chunks_for(num_cells: int, chunk_size: int) -> int:
    return -(-num_cells // chunk_size)


def num_chunks_to_grow(table: ChunkTable, num_cells: int, chunk_size: int) -> int:
    return max(0, chunks_for(num_cells, chunk_size) - len(table.chunk_ids))


def grow(table: ChunkTable, pool: KVPool, num_cells: int) -> None:
    """Give `table` room for `num_cells` cells; the caller checked the pool has it. The new
    chunks continue the table's last run of ids where they are free (see kv/pool.py)."""
    n = num_chunks_to_grow(table, num_cells, pool.chunk_size)
    if n:
        table.chunk_ids.extend(pool.allocate(n, after=last_id(table.chunk_ids)))


def last_id(chunk_ids: list[int]) -> int | None:
    """The id a chunk appended to `chunk_ids` should follow (None: a new table)."""
    return chunk_ids[-1] if chunk_ids else None


def release(table: ChunkTable, pool: KVPool) -> None:
    pool.release(table.chunk_ids)
    for w in table.windows:
        wt.release(w)
    table.chunk_ids = []
    table.num_cells = 0


def num_chunks_to_fork(num_cells: int, chunk_size: int) -> int:
    """A fork shares full chunks and needs one new chunk for a partial last one."""
    return 1 if num_cells % chunk_size else 0


def fork(table: ChunkTable, pool: KVPool, num_cells: int) -> tuple[ChunkTable, list[CellCopy]]:
    """A new table holding the first `num_cells` cells of `table`."""
    assert num_cells <= table.num_cells
    c = pool.chunk_size
    num_full, rest = divmod(num_cells, c)
    shared = table.chunk_ids[:num_full]
    new = pool.allocate(1 if rest else 0, after=last_id(shared))  # first: a pool error leaves every refcount as it was
    pool.share(shared)
    copies = [CellCopy(table.chunk_ids[num_full], new[0], 0, rest)] if rest else []
    windows = []
    for w in table.windows:  # the caller made room in every windowed group (num_window_chunks_to_fork)
        forked, copy = wt.fork(w, num_cells)
        windows.append(forked)
        if copy is not None:
            copies.append(CellCopy(copy[0], copy[1], 0, copy[2], w.group))
    return ChunkTable(shared + new, num_cells, windows), copies


def num_window_chunks_to_fork(table: ChunkTable, num_cells: int) -> tuple[int, ...]:
    """Per windowed group: a fork copies a partial last chunk there too."""
    return tuple(1 if num_cells % w.pool.chunk_size else 0 for w in table.windows)


def num_window_chunks_to_truncate(table: ChunkTable, num_cells: int) -> tuple[int, ...]:
    return tuple(wt.num_to_truncate(w, num_cells) for w in table.windows)


def windows_held(table: ChunkTable, num_cells: int) -> bool:
    """Every windowed group holds the window before position `num_cells` (the table cut there
    could go on without recomputing)."""
    return all(wt.is_held(w, num_cells) for w in table.windows)


def num_chunks_to_truncate(table: ChunkTable, pool: KVPool, num_cells: int) -> int:
    """Truncating into a shared chunk copies its kept cells into a private one."""
    c = pool.chunk_size
    if num_cells % c == 0:
        return 0
    last = table.chunk_ids[num_cells // c]
    return 1 if pool.is_shared(last) else 0


def truncate(table: ChunkTable, pool: KVPool, num_cells: int) -> list[CellCopy]:
    """Keep the first `num_cells` cells (a branch from a checkpoint); free the rest."""
    assert num_cells <= table.num_cells
    c = pool.chunk_size
    keep = chunks_for(num_cells, c)
    need, tail = num_chunks_to_truncate(table, pool, num_cells), table.chunk_ids[keep:]
    if need and need > (room := pool.num_free + pool.num_freed_by_release(tail)):
        raise PoolExhausted(need, room)  # checked before anything changes
    pool.release(tail)  # first, so the copy may take a chunk the tail gave back
    del table.chunk_ids[keep:]
    table.num_cells = num_cells
    copies = []
    if need:
        (new,) = pool.allocate(1, after=last_id(table.chunk_ids[:-1]))
        copies.append(CellCopy(table.chunk_ids[-1], new, 0, num_cells % c))
        pool.release([table.chunk_ids[-1]])
        table.chunk_ids[-1] = new
    for w in table.windows:  # the caller checked the windows before num_cells are held (windows_held)
        copy = wt.truncate(w, num_cells)
        if copy is not None:
            copies.append(CellCopy(copy[0], copy[1], 0, copy[2], w.group))
    return copies


def adopt(table: ChunkTable, pool: KVPool, index: int, chunk_id: int) -> None:
    """Hold `chunk_id` (full, with the same K/V) in place of the table's chunk `index`."""
    assert (index + 1) * pool.chunk_size <= table.num_cells, "only a full chunk is shared"
    pool.share([chunk_id])  # first: a pool error leaves the table as it was
    pool.release([table.chunk_ids[index]])
    table.chunk_ids[index] = chunk_id


def is_writable(table: ChunkTable, pool: KVPool) -> bool:
    """The invariant: the chunk holding the next write position is private."""
    i = table.num_cells // pool.chunk_size
    return ((i >= len(table.chunk_ids) or not pool.is_shared(table.chunk_ids[i]))
            and all(wt.is_writable(w, table.num_cells) for w in table.windows))


def copy_cells(src: ChunkTable, dst: ChunkTable, num_cells: int, chunk_size: int) -> list[CellCopy]:
    """The copies that put the first `num_cells` cells of `src` into `dst` (reserved moves)."""
    copies = []
    for i in range(chunks_for(num_cells, chunk_size)):
        n = min(chunk_size, num_cells - i * chunk_size)
        copies.append(CellCopy(src.chunk_ids[i], dst.chunk_ids[i], 0, n))
    return copies

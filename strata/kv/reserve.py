"""The reserved layout (no `--kv-pool-tokens`): the seed-compatible baseline.

Each lane allocates chunks covering the whole `--max-context` at start and keeps them
for the engine's life, however short its conversation. A conversation lives in its
lane's table; moving it to another lane copies its cells. Every pool figure is
measured against this layout.
"""

from __future__ import annotations

from collections.abc import Iterable

from strata.kv.layout import KVLayout
from strata.kv.pool import KVPool
from strata.kv.table import CellCopy, ChunkTable, chunks_for, copy_cells


class ReservedLayout(KVLayout):
    name = "reserved"
    holds_parked = False
    moves_copy = True
    shares_chunks = False

    def __init__(self, num_lanes: int, max_context: int, chunk_size: int):
        per_lane = chunks_for(max_context, chunk_size)
        self.pool = KVPool(num_lanes * per_lane, chunk_size)
        self.lane_tables: list[ChunkTable] = []
        for _ in range(num_lanes):  # lane i holds ids [i * per_lane, (i + 1) * per_lane)
            after = self.lane_tables[-1].chunk_ids[-1] if self.lane_tables else None
            self.lane_tables.append(ChunkTable(self.pool.allocate(per_lane, after=after), 0))

    def new_table(self, lane: int) -> ChunkTable:
        table = self.lane_tables[lane]
        assert table.num_cells == 0, f"lane {lane} still holds a conversation"
        return table

    def move(self, table: ChunkTable, dst_lane: int) -> tuple[ChunkTable, list[CellCopy]]:
        dst = self.new_table(dst_lane)
        copies = copy_cells(table, dst, table.num_cells, self.chunk_size)
        dst.num_cells, table.num_cells = table.num_cells, 0
        return dst, copies

    def fork(self, table: ChunkTable, num_cells: int, dst_lane: int) -> tuple[ChunkTable, list[CellCopy]]:
        dst = self.new_table(dst_lane)
        dst.num_cells = num_cells
        return dst, copy_cells(table, dst, num_cells, self.chunk_size)

    def num_chunks_to_fork(self, num_cells: int) -> int:
        return 0

    def num_chunks_to_grow_from(self, num_chunks_held: int, num_cells: int) -> int:
        return 0  # a lane's reservation covers --max-context; the engine refuses longer prompts

    def grow(self, table: ChunkTable, num_cells: int) -> None:
        assert num_cells <= table.cell_capacity(self.chunk_size), "past the lane's reservation"

    def num_chunks_to_truncate(self, table: ChunkTable, num_cells: int) -> int:
        return 0

    def truncate(self, table: ChunkTable, num_cells: int) -> list[CellCopy]:
        assert num_cells <= table.num_cells
        table.num_cells = num_cells
        return []

    def num_freed_by_truncate(self, table: ChunkTable, num_cells: int) -> int:
        return 0

    def release(self, table: ChunkTable) -> None:
        table.num_cells = 0  # the lane keeps its reservation

    def num_freed_by_release(self, tables: Iterable[ChunkTable]) -> int:
        return 0

    def num_chunks_in_lane(self, lane: int, table: ChunkTable | None) -> int:
        return len(self.lane_tables[lane].chunk_ids)

    def reserved_chunks(self) -> list[int]:
        return [i for t in self.lane_tables for i in t.chunk_ids]

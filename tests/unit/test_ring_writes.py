"""Where a ring step's new cells go (cells/ring_cells.py): split once per step between the arena
and staging, then written there and through to the pool, cell for cell."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from strata.cells.dense import DenseCells
from strata.cells.ring_cells import RingCells, StepState, StepWrites

ARENA = 8  # virtual cells [0, 8) are the arena's, [8, 12) staging's


def test_split_names_each_rows_buffer_and_cell():
    w = StepWrites.split([3, 9, 0, 11], ARENA)
    assert w.arena_rows.tolist() == [0, 2] and w.arena_cells.tolist() == [3, 0]
    assert w.staged_rows.tolist() == [1, 3] and w.staged_cells.tolist() == [1, 3]
    assert w.arena_index.tolist() == [3, -1, 0, -1] and w.staged_index.tolist() == [-1, 1, -1, 3]
    assert w.in_arena and w.in_staging


def test_split_of_no_rows_writes_nowhere():
    w = StepWrites.split([], ARENA)
    assert not w.in_arena and not w.in_staging and w.arena_index.numel() == 0


def _state(host_index: torch.Tensor, writes: StepWrites) -> StepState:
    state = StepState()
    state.point(host_index, writes, None)
    return state


def _cells(num_cells: int) -> DenseCells:
    return DenseCells.zeros(2, num_cells, 4, torch.float32, torch.device("cpu"))


@given(st.lists(st.integers(0, ARENA + 3), min_size=1, max_size=6, unique=True))
def test_a_write_lands_in_its_buffer_and_in_the_pool(virtual):
    arena, staging, host = _cells(ARENA), _cells(4), _cells(32)
    host_index = torch.tensor([20 + i for i in range(len(virtual))])
    cells = RingCells(arena, staging, host, _state(host_index, StepWrites.split(virtual, ARENA)))
    x = torch.arange(2 * len(virtual) * 4, dtype=torch.float32).view(2, len(virtual), 4) + 1
    cells.write(torch.tensor(virtual), x)
    for row, c in enumerate(virtual):
        where, cell = (arena, c) if c < ARENA else (staging, c - ARENA)
        assert torch.equal(where.data[:, cell], x[:, row])
        assert torch.equal(host.data[:, 20 + row], x[:, row])
    written = sum(int(t.data.abs().sum(dim=(0, 2)).ne(0).sum()) for t in (arena, staging))
    assert written == len(virtual)  # no other cell was touched


def test_write_targets_name_the_pool_and_only_the_buffers_written():
    arena, staging, host = _cells(ARENA), _cells(4), _cells(32)
    v_arena, v_staging, v_host = _cells(ARENA), _cells(4), _cells(32)
    host_index = torch.tensor([5, 6])
    state = _state(host_index, StepWrites.split([1, 2], ARENA))
    k, v = RingCells(arena, staging, host, state), RingCells(v_arena, v_staging, v_host, state)
    t = k.write_targets(v, torch.tensor([1, 2]), torch.float32)
    k_views, v_views, indices = t.k, t.v, t.cells
    assert t.k_scales == [] and t.v_scales == []  # stored unscaled
    assert [t is u for t, u in zip(k_views, (host.data, arena.data))] == [True, True] and len(k_views) == 2
    assert v_views[1] is v_arena.data and [i.tolist() for i in indices] == [[5, 6], [1, 2]]
    state.point(host_index, StepWrites.split([1, 9], ARENA), None)  # the next step: the same views
    t = k.write_targets(v, torch.tensor([1, 9]), torch.float32)
    k_views, indices = t.k, t.cells
    assert k_views[2] is staging.data and [i.tolist() for i in indices] == [[5, 6], [1, -1], [-1, 1]]
    assert k.write_targets(v, torch.tensor([1, 9]), torch.bfloat16) is None  # stored in another dtype

"""Layer groups: the layers that attend the same way, each group with its own chunk store.

Group 0 is full attention: every layer without a window. It keeps the table's positions
(`ChunkTable.chunk_ids`, the ids every existing count and test speaks of); for a model
whose every layer has a window it holds no layer, so its chunks cost no K/V (they still
bound the conversation's length). Groups 1.. are one per distinct window, ascending: a
windowed group's table (kv/window_table.py) holds only the chunks the window of the next
token can still read.

A token at position p of a layer with window W reads positions max(0, p - W + 1) .. p
(as transformers' sliding-window mask), so a conversation of `n` cells, whose next token
is at position n, needs positions `window_start(n, W)` .. n - 1 of each windowed group.
No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerGroup:
    window: int | None  # None: full attention
    layers: tuple[int, ...]


def layer_groups(layer_windows: Sequence[int | None], num_layers: int) -> tuple[LayerGroup, ...]:
    """The full group first (possibly of no layer), then one group per window, ascending.
    `layer_windows` empty: every layer attends fully (one group)."""
    windows = list(layer_windows) if layer_windows else [None] * num_layers
    assert len(windows) == num_layers, (len(windows), num_layers)
    full = LayerGroup(None, tuple(i for i, w in enumerate(windows) if w is None))
    distinct = sorted({w for w in windows if w is not None})
    return (full, *(LayerGroup(w, tuple(i for i, x in enumerate(windows) if x == w)) for w in distinct))


def group_of_layers(groups: Sequence[LayerGroup], num_layers: int) -> list[int]:
    """Each layer's group index."""
    out = [-1] * num_layers
    for g, group in enumerate(groups):
        for i in group.layers:
            out[i] = g
    assert all(g >= 0 for g in out), "a layer in no group"
    return out


def window_start(num_cells: int, window: int) -> int:
    """The first position the token at position `num_cells` reads through `window`."""
    return max(0, num_cells - window + 1)


def window_bound(window: int, chunk_size: int) -> int:
    """Chunks a decoding conversation holds in a group with `window`, whatever its length:
    positions window_start(n) .. n (the next write) span at most this many chunks."""
    return -(-window // chunk_size) + 1


def lane_window_chunks(window: int, chunk_size: int, step_cells: int) -> int:
    """Chunks one lane holds in a windowed group during a step that writes up to
    `step_cells` cells (a prefill piece, a pending token and its drafts): the window before
    the step's first position and the step's cells."""
    return -(-(window - 1 + step_cells) // chunk_size) + 1


def window_pool_chunks(window: int, chunk_size: int, num_lanes: int, step_cells: int, num_parked: int) -> int:
    """A windowed group's pool: every lane's window and step (`lane_window_chunks`), and the window
    an admission branches from with the chunk its fork copies, so no lane ever waits or ends for
    windowed room; and the windows of `num_parked` idle conversations besides (more idle
    conversations give way, least recently used first)."""
    bound = window_bound(window, chunk_size)
    return num_lanes * lane_window_chunks(window, chunk_size, step_cells) + (num_parked + 1) * bound + 1

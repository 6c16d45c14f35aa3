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


def _ranges(layers: Sequence[int]) -> str:
    """(0, 1, 2, 4, 6, 7) -> "0-2, 4, 6-7"."""
    runs: list[list[int]] = []
    for i in layers:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def describe_groups(groups: Sequence[LayerGroup], num_chunks: Sequence[int], chunk_size: int,
                    bytes_per_cell: Sequence[int]) -> str:
    """Each group's window, layers, chunks and K/V bytes (`bytes_per_cell`: of its layers), for
    the engine's start line."""
    def size(num_bytes: int) -> str:
        mib = 1 << 20
        return f"{num_bytes / mib:.1f} MiB" if num_bytes >= mib else f"{num_bytes / 1024:.1f} KiB"

    return "; ".join(
        f"{'full' if g.window is None else f'window {g.window}'}: {len(g.layers)} layer{'s' * (len(g.layers) != 1)}"
        f" ({_ranges(g.layers) or 'none: no K/V'}), {n} chunks, {size(n * chunk_size * b)}"
        for g, n, b in zip(groups, num_chunks, bytes_per_cell, strict=True))

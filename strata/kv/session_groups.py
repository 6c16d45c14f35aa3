"""Which cells of each layer group a session file holds, and which a restore needs (kv/groups.py).

A span is (start, end): positions [start, end). The full group holds [0, n) of a conversation of
n cells. A windowed group (window W) holds the cells of the chunks its table keeps: the chunks
covering the window before the next token at n and the window before each kept position p
(kv/window_table.py), each chunk cut at n: `held_spans`. A save writes those of the saving
pool's chunks; a restore needs those of its own pool's chunks, and goes on only when the file
holds every one (`covers`): a pool whose chunk size divides the file's (`block_cells`) always
is, and a kept window the file does not cover in the restoring pool's chunks is not kept.

Reading through held spans is exact: a token at p of a windowed layer reads positions
window_start(p, W) .. p, and a conversation goes on from p only where every chunk of that
window is held (`window_table.is_held`), so every cell any later token reads is in a held span.
No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from strata.kv.window_table import needed_from

Span = tuple[int, int]


@dataclass(frozen=True)
class FileGroup:
    """One layer group as a session file states it: its window (None: full attention), its layers
    (ascending model layer indices) and the spans of positions whose cells its records hold."""

    window: int | None
    layers: tuple[int, ...]
    spans: tuple[Span, ...]

    @property
    def num_cells(self) -> int:
        return sum(e - s for s, e in self.spans)


def merge(spans: Iterable[Span]) -> tuple[Span, ...]:
    """Sorted, disjoint, non-adjacent spans covering the same positions (empty ones dropped)."""
    out: list[list[int]] = []
    for s, e in sorted(x for x in spans if x[1] > x[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return tuple((s, e) for s, e in out)


def held_spans(window: int, chunk_size: int, num_cells: int, kept: Sequence[int]) -> tuple[Span, ...]:
    """The cells of the chunks (of `chunk_size`) a windowed group's table holds for a conversation
    of `num_cells` keeping the windows before `kept` (positions < num_cells), cut at num_cells."""
    c = chunk_size
    spans = [(needed_from(p, window, c) * c, min(-(-p // c) * c, num_cells)) for p in [*kept, num_cells]]
    return merge(spans)


def covers(have: Sequence[Span], need: Sequence[Span]) -> bool:
    """Every position of `need` is in `have` (both merged)."""
    return all(any(s <= a and b <= e for s, e in have) for a, b in need)


def overlap(start: int, num_cells: int, spans: Sequence[Span]) -> list[tuple[int, int]]:
    """(offset from `start`, cells) of positions [start, start + num_cells) that are in `spans`."""
    end = start + num_cells
    return [(max(s, start) - start, min(e, end) - max(s, start)) for s, e in spans if s < end and e > start]


def records(spans: Sequence[Span], block_cells: int) -> list[tuple[int, int]]:
    """(first position, cells) of each record over `spans`: each span cut into `block_cells` pieces."""
    return [(p, min(block_cells, e - p)) for s, e in spans for p in range(s, e, block_cells)]

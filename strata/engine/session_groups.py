"""Session files and layer groups (kv/groups.py): what a save writes of each group, and which
kept windows a restore holds (the byte format: kv/session_format.py, the spans:
kv/session_groups.py).

A save of a conversation of n cells in an engine with windowed groups writes version 2: the
full group's every cell, and in each windowed group the cells of the chunks of its window
before n and of the windows before its kept positions that every windowed group holds (a
window held in one group only could not be gone on from). An engine of one group writes
version 1. A restore keeps the file's kept windows (version 1: the windows before its
checkpoints) that the file holds in the restoring pool's chunks; it refuses by name a file
whose last windows it does not hold (a pool of larger chunks). No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from strata.engine.conversation import Conversation
from strata.errors import SessionFileError
from strata.kv import window_table as wt
from strata.kv.groups import LayerGroup
from strata.kv.session_format import KVGeometry, SessionHeader
from strata.kv.session_groups import FileGroup, covers, held_spans


def file_header(fingerprint: str, geometry: KVGeometry, groups: Sequence[LayerGroup], chunk_size: int,
                conv: Conversation, n: int, metadata: dict) -> SessionHeader:
    """The header of a file of `conv`'s first `n` cells (its windows before n are held); `groups`
    empty: one group of every layer (version 1)."""
    header = SessionHeader(fingerprint, geometry, chunk_size, conv.token_ids[:n],
                           [p for p in conv.checkpoints if p <= n], metadata)
    if not groups:
        return header
    windows = conv.table.windows
    kept = sorted(p for p in set(windows[0].kept).intersection(*(w.kept for w in windows[1:]))
                  if 0 < p < n and all(wt.is_held(w, p) for w in windows))
    spans = [((0, n),)] + [held_spans(g.window, chunk_size, n, kept) for g in groups[1:]]
    return replace(header, groups=tuple(FileGroup(g.window, tuple(g.layers), s) for g, s in zip(groups, spans)),
                   windows_kept=kept)


def restore_kept(h: SessionHeader, path: str, groups: Sequence[LayerGroup], chunk_size: int) -> list[int]:
    """The positions whose windows a restore into `groups` (pool chunks of `chunk_size`) keeps,
    the file's layer groups matching (`cells/session.check_groups`); SessionFileError
    (session_mismatch) when the file lacks cells of the last window in these chunks."""
    n, c = h.num_cells, chunk_size
    if not groups:
        return []
    have = [h.file_groups[g if h.groups else 0].spans for g in range(1, len(groups))]
    if not all(covers(s, held_spans(g.window, c, n, [])) for s, g in zip(have, groups[1:])):
        raise SessionFileError(path, f"its windowed groups hold the cells of {h.block_cells}-cell chunks; this "
                                     f"pool's {c}-cell chunks would read cells it lacks: restore it in a pool "
                                     f"whose --kv-chunk divides {h.block_cells}", code="session_mismatch")
    candidates = h.windows_kept if h.groups else [p for p in h.checkpoints if 0 < p < n]
    return [p for p in candidates if all(covers(s, held_spans(g.window, c, n, [p])) for s, g in zip(have, groups[1:]))]

"""A conversation's chunks in one windowed layer group (kv/groups.py).

`WindowIds.chunk_ids[j]` holds positions [j * c, (j + 1) * c) of the group's layers, or
None once released: a chunk wholly behind the window of the conversation's next token
is given back to the group's pool when the conversation's cells pass it (`pass_window`,
at commit: only committed cells move the window, so a draft that is rejected never
released a chunk a kept one needs). The ids come from the group's own pool, one id
space per group; the operations mirror kv/table.py's and go through that pool.

Kept windows: the chunks covering the window before each position of `kept` (the
conversation's checkpoints and its prompts' ends, where a branch or a regenerate goes
on from) stay while the conversation is held, so such a branch recomputes nothing; they
give way before any conversation does (`drop_kept`, engine/window_room.py's order).

Invariants:
- `len(chunk_ids) <= chunks_for(table capacity)`: a windowed group grows per step, only
  for the cells the step writes (`grow`), never for a whole prompt at once;
- every chunk covering positions window_start(num_cells) .. num_cells - 1 is held (not
  None); a chunk wholly behind window_start(num_cells) is held only while it covers a
  kept window (`is_kept`);
- the chunk that position `num_cells` falls in (the next write) is never shared.
No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.kv.groups import window_start
from strata.kv.pool import KVPool


@dataclass(eq=False)
class WindowIds:
    pool: KVPool  # the group's pool: the only one that hands out these ids
    window: int
    group: int  # the group's index (1..), what a CellCopy of these ids names
    chunk_ids: list[int | None]
    kept: list[int] = field(default_factory=list)  # positions whose window before them stays, ascending

    @property
    def held(self) -> list[int]:
        return [i for i in self.chunk_ids if i is not None]


def _last(ids: list[int | None]) -> int | None:
    return next((i for i in reversed(ids) if i is not None), None)


def needed_from(num_cells: int, window: int, chunk_size: int) -> int:
    """The first chunk index a conversation of `num_cells` still reads (chunks before it are released)."""
    return window_start(num_cells, window) // chunk_size


def num_to_grow(w: WindowIds, num_cells_held: int, num_cells: int) -> int:
    """New chunks `w` needs so that a step from `num_cells_held` writes up to `num_cells`."""
    c = w.pool.chunk_size
    first = needed_from(num_cells_held, w.window, c)
    return sum(1 for j in range(len(w.chunk_ids), -(-num_cells // c)) if j >= first or is_kept(w, j))


def grow(w: WindowIds, num_cells_held: int, num_cells: int) -> None:
    """Room for positions up to `num_cells`; chunk indices wholly behind the window of
    `num_cells_held` are never allocated (None) unless a kept window covers them (a restore's
    checkpoints). The caller checked the pool has room."""
    c = w.pool.chunk_size
    first = needed_from(num_cells_held, w.window, c)
    for j in range(len(w.chunk_ids), -(-num_cells // c)):
        if j < first and not is_kept(w, j):
            w.chunk_ids.append(None)
        else:
            (i,) = w.pool.allocate(1, after=_last(w.chunk_ids))
            w.chunk_ids.append(i)


def is_kept(w: WindowIds, index: int) -> bool:
    """Chunk `index` covers part of a kept window (the window before a kept position)."""
    c = w.pool.chunk_size
    return any(needed_from(p, w.window, c) <= index < -(-p // c) for p in w.kept)


def pass_window(w: WindowIds, num_cells: int) -> int:
    """The conversation holds `num_cells` cells now: release every chunk wholly behind its
    next token's window that no kept window covers. Returns how many ids were given up."""
    first = min(needed_from(num_cells, w.window, w.pool.chunk_size), len(w.chunk_ids))
    gone = [j for j in range(first) if w.chunk_ids[j] is not None and not is_kept(w, j)]
    if gone:
        w.pool.release([w.chunk_ids[j] for j in gone])
        for j in gone:
            w.chunk_ids[j] = None
    return len(gone)


def keep(w: WindowIds, positions: list[int], num_cells: int) -> None:
    """Keep the windows before `positions` (those not past the conversation's `num_cells` + its
    prompt, whose windows are still held or still to come)."""
    w.kept = sorted(set(w.kept) | {p for p in positions if p > 0 and (p > num_cells or is_held(w, p))})


def keep_ahead(w: WindowIds, positions: list[int]) -> None:
    """Keep the windows before `positions` of a table whose cells are still to be written (a
    restore: `grow` then holds them)."""
    assert not w.chunk_ids
    w.kept = sorted({p for p in positions if p > 0})


def kept_only(w: WindowIds, num_cells: int) -> list[int]:
    """The ids held only for kept windows (what `drop_kept` gives back)."""
    first = min(needed_from(num_cells, w.window, w.pool.chunk_size), len(w.chunk_ids))
    return [i for i in w.chunk_ids[:first] if i is not None]


def keep_only(w: WindowIds, position: int, num_cells: int) -> int:
    """Every kept window gives way but the one before `position` (held: an admission goes on
    from there). Returns the ids released."""
    assert is_held(w, position)
    w.kept = [position] if position < num_cells else []
    return pass_window(w, num_cells)


def drop_kept(w: WindowIds, num_cells: int) -> int:
    """The kept windows give way: a branch from them recomputes. Returns the ids released."""
    w.kept = []
    return pass_window(w, num_cells)


def release(w: WindowIds) -> None:
    w.pool.release(w.held)
    w.chunk_ids = []


def is_held(w: WindowIds, num_cells: int) -> bool:
    """Every chunk the token at position `num_cells` reads before itself is held (a
    conversation cut to `num_cells` could go on from there)."""
    c = w.pool.chunk_size
    ids = w.chunk_ids
    lo, hi = needed_from(num_cells, w.window, c), -(-num_cells // c)
    return hi <= len(ids) and all(ids[j] is not None for j in range(lo, hi))


def fork(w: WindowIds, num_cells: int) -> tuple[WindowIds, tuple[int, int, int] | None]:
    """A new group table holding the window before position `num_cells` of `w`: full chunks
    shared, a partial last chunk copied (returned as (src, dst, cells)); chunks behind the
    window are not held by the fork."""
    assert is_held(w, num_cells)
    c = w.pool.chunk_size
    num_full, rest = divmod(num_cells, c)
    first = needed_from(num_cells, w.window, c)
    forked = WindowIds(w.pool, w.window, w.group, [], [p for p in w.kept if p <= num_cells])
    ids: list[int | None] = [w.chunk_ids[j] if j >= first or is_kept(forked, j) else None for j in range(num_full)]
    shared = [i for i in ids if i is not None]
    new = w.pool.allocate(1 if rest else 0, after=_last(ids))
    w.pool.share(shared)
    forked.chunk_ids = ids + new
    copy = (w.chunk_ids[num_full], new[0], rest) if rest else None
    return forked, copy


def num_to_truncate(w: WindowIds, num_cells: int) -> int:
    c = w.pool.chunk_size
    if num_cells % c == 0 or num_cells // c >= len(w.chunk_ids):
        return 0
    last = w.chunk_ids[num_cells // c]
    return 1 if last is not None and w.pool.is_shared(last) else 0


def truncate(w: WindowIds, num_cells: int) -> tuple[int, int, int] | None:
    """Keep positions before `num_cells` (whose window `is_held`); free the rest. Truncating into
    a shared chunk copies its kept cells into a private one: returned as (src, dst, cells)."""
    c = w.pool.chunk_size
    kept = -(-num_cells // c)
    need = num_to_truncate(w, num_cells)
    w.pool.release([i for i in w.chunk_ids[kept:] if i is not None])
    del w.chunk_ids[kept:]
    w.kept = [p for p in w.kept if p <= num_cells]
    if not need:
        return None
    old = w.chunk_ids[-1]
    (new,) = w.pool.allocate(1, after=_last(w.chunk_ids[:-1]))
    w.pool.release([old])
    w.chunk_ids[-1] = new
    return old, new, num_cells % c


def adopt(w: WindowIds, index: int, chunk_id: int | None) -> bool:
    """Hold `chunk_id` (full, the same K/V: another conversation's) in place of chunk `index`,
    where both are held and differ; returns whether it did."""
    mine = w.chunk_ids[index] if index < len(w.chunk_ids) else None
    if mine is None or chunk_id is None or mine == chunk_id:
        return False
    w.pool.share([chunk_id])  # first: a pool error leaves the table as it was
    w.pool.release([mine])
    w.chunk_ids[index] = chunk_id
    return True


def is_writable(w: WindowIds, num_cells: int) -> bool:
    j = num_cells // w.pool.chunk_size
    return j >= len(w.chunk_ids) or w.chunk_ids[j] is None or not w.pool.is_shared(w.chunk_ids[j])


def reusable(windows: list[WindowIds], num_cells: int) -> int:
    """The longest prefix, at most `num_cells`, whose windows every group holds (0: none)."""
    n = num_cells
    while n > 0:
        bad = next((w for w in windows if not is_held(w, n)), None)
        if bad is None:
            return n
        c = bad.pool.chunk_size
        # the last released chunk the window of position n would read: n must go below its start
        lo, hi = needed_from(n, bad.window, c), min(-(-n // c), len(bad.chunk_ids))
        holes = [j for j in range(lo, hi) if bad.chunk_ids[j] is None]
        n = holes[-1] * c if holes else min(n - 1, len(bad.chunk_ids) * c)
    return 0


def snapshot(w: WindowIds, num_cells: int, kept: list[int]) -> WindowIds:
    """A save's snapshot of `w` (engine/holds.py): the chunks covering the window before
    `num_cells` and before each of `kept` (held), one more holder on each; None elsewhere."""
    c = w.pool.chunk_size
    need = {j for p in [*kept, num_cells] for j in range(needed_from(p, w.window, c), -(-p // c))}
    ids = [w.chunk_ids[j] if j in need else None for j in range(-(-num_cells // c))]
    assert all(ids[j] is not None for j in need), "a snapshot of a window the table does not hold"
    w.pool.share([i for i in ids if i is not None])
    return WindowIds(w.pool, w.window, w.group, ids, list(kept))


def num_to_hold(window: int, chunk_size: int, num_cells: int, kept: list[int]) -> int:
    """Chunks a new table of `num_cells` holds keeping the windows before `kept` (a restore)."""
    c = chunk_size
    return len({j for p in [*kept, num_cells] for j in range(needed_from(p, window, c), -(-p // c))})

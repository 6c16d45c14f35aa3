"""The resident ring per layer group (`--kv-resident` with kv/groups.py's groups): one `KVRing` each.

Group 0 (full attention) is the ring as without groups: each lane's ring is sized there (the
rule, the budget) and its layers read every page of the conversation, streaming what the ring
cannot hold. A windowed group's ring reads only the pages of its window (from the page of the
window's first position, through the group's own table): each lane keeps
`min(lane's ring, window_ring_cells(window, step, page))` cells of it per layer, and the
group's arena holds every lane's (`min(--kv-ring-budget, lanes x window ring)` cells per
layer), so once a lane's ring covers its window and step, its windowed layers are read from
device cells only and that group streams nothing (a page entering the window is written
there first: it is admitted without a copy, cells/ring.py `_committed`).

Windowed groups evict by `clock` whatever `--kv-evict` says: a page that left every window is
never read again (but by a branch), which lrfu's frequency would keep in place of the new
pages. With one group, this is the plain ring. Only the pool touches chunk ids: the rings
read the lanes' tables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from strata.cells.ring import KVRing, RingGroup
from strata.cells.ring_cells import RingCells
from strata.cells.ring_counters import RingCounters
from strata.cells.ring_step import RingStep
from strata.cells.storage import KVStorage
from strata.kv.groups import LayerGroup
from strata.kv.ring_rule import RingSizing, window_ring_cells
from strata.step import LaneWork

SUMMED = ("resident_pages", "arena_pages", "pages_streamed", "pages_admitted", "bytes_streamed")


class GroupedStep:
    """One step through every group's ring: layer i's K/V through its group's `RingStep`."""

    def __init__(self, steps: Sequence[RingStep], layer_group: Sequence[int]):
        self.steps = tuple(steps)  # per group, in group order
        self.layer_group = layer_group
        if len(self.steps) == 1:  # one group: its step's own (one call less a layer)
            self.layer_caches = self.steps[0].layer_caches

    def layer_caches(self, i: int) -> tuple[RingCells, RingCells]:
        return self.steps[self.layer_group[i]].layer_caches(i)

    def finish(self) -> None:
        for step in self.steps:
            step.finish()


class GroupedRing:
    """The engine's ring: `rings[g]` serves layer group g; `full` (group 0) sizes every lane's ring."""

    def __init__(self, host: KVStorage, sizing: RingSizing, policy: str, budget_cells: int,
                 layer_devices: Sequence[torch.device], groups: Sequence[LayerGroup], num_lanes: int,
                 step_cells: int, copy_cells: Callable | None = None):
        """`groups`: the layer groups whose storage `host` holds (one: every layer); `step_cells`:
        the most cells a lane writes in a step (a windowed lane reads its window and those);
        `copy_cells`: the extension's page copy for every ring (KVRing)."""
        groups = tuple(groups) or (LayerGroup(None, tuple(range(host.num_layers))),)
        self.full = KVRing(host, sizing, policy, budget_cells, layer_devices, RingGroup(0, groups[0].layers),
                           copy_cells)
        self.window_cells: list[int] = []  # per windowed group: the ring that holds a lane's window and step
        self.rings = [self.full]
        for g, group in enumerate(groups[1:], start=1):
            cells = min(sizing.cap_cells, window_ring_cells(group.window, step_cells, sizing.page))
            self.window_cells.append(cells)
            self.rings.append(KVRing(host, sizing, "clock", min(budget_cells, num_lanes * cells), layer_devices,
                                     RingGroup(g, group.layers, group.window), copy_cells))
        self.layer_group = host.layer_group

    # ---- what the engine and tests ask of "the ring" (the full group's sizing and budget) ---------------
    @property
    def counters(self) -> RingCounters:
        return self.full.counters

    @property
    def budget_cells(self) -> int:
        return self.full.budget_cells

    def attach_budget(self, budget, on_split) -> None:
        assert len(self.rings) == 1, "--device-memory grants one ring: engine/build.py keeps one group there"
        self.full.attach_budget(budget, on_split)

    def check(self) -> None:
        for ring in self.rings:
            ring.residency.check()

    # ---- one step ---------------------------------------------------------------------------
    def prepare(self, work: Sequence[LaneWork], write_index: Mapping[int | None, torch.Tensor],
                busy_lanes: Iterable[int] = ()) -> GroupedStep:
        """`write_index`: per window (None: full attention) the new cells in that group's pool, rows in order."""
        busy = tuple(busy_lanes)
        steps = [self.full.prepare(work, write_index[None], busy)]
        try:
            rings = [self.full.counters.lanes[w.lane].ring_cells for w in work]
            for ring, cells in zip(self.rings[1:], self.window_cells):
                steps.append(ring.prepare(work, write_index[ring.window], busy, [min(r, cells) for r in rings]))
        except BaseException:
            self.abort(GroupedStep(steps, self.layer_group))
            raise
        return GroupedStep(steps, self.layer_group)

    def abort(self, step: GroupedStep) -> None:
        for ring, s in zip(self.rings, step.steps):
            ring.abort(s)

    # ---- what users see -----------------------------------------------------------------------
    def stats(self) -> dict:
        """The full group's ring as without groups, with the counts summed over every group; and
        `groups`: each group's own (window None: full attention)."""
        per = [ring.stats() for ring in self.rings]
        out = dict(per[0])
        for key in SUMMED:
            out[key] = sum(s[key] for s in per)
        tokens = self.full.counters.tokens
        out["bytes_streamed_per_token"] = out["bytes_streamed"] / tokens if tokens else 0.0
        out["pages_streamed_per_token"] = (out["pages_streamed"] + out["pages_admitted"]) / tokens if tokens else 0.0
        reads = sum(r.counters.page_reads for r in self.rings)
        out["hit_ratio"] = sum(r.counters.page_hits for r in self.rings) / reads if reads else 0.0
        out["groups"] = [{"window": r.window, "layers": len(r.layers), "budget_cells": r.budget_cells,
                          **{k: s[k] for k in (*SUMMED, "hit_ratio")}} for r, s in zip(self.rings, per)]
        return out

    def lane_stats(self, lane: int) -> dict | None:
        """The lane's full-group ring; with groups, `window_rings`: its ring cells per window."""
        out = self.full.lane_stats(lane)
        if out is not None and len(self.rings) > 1:
            out["window_rings"] = {str(r.window): r.counters.lanes[lane].ring_cells
                                   for r in self.rings[1:] if lane in r.counters.lanes}
        return out

    def describe(self) -> str:
        """Each group's ring for the start line: its layers, a lane's ring (at most) and the arena, in cells."""
        return ", ".join(
            f"{'full' if r.window is None else f'window {r.window}'}: {len(r.layers)} layers, "
            f"ring <= {cells} cells, arena {r.budget_cells} cells"
            for r, cells in zip(self.rings, (self.full.sizing.cap_cells, *self.window_cells)))

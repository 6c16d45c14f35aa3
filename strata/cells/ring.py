"""The resident K/V ring (`--kv-resident R`): per lane, up to R cells per layer on the device.

The pool (cells/storage.py) lives in host memory and is the source of truth. The ring's
device memory is one arena of page slots per layer (kv/residency.py decides which page
sits in which slot; a page shared by several conversations is resident once) and a
staging buffer per device that holds the step's streamed pages for one layer at a time.

Per step and layer (`RingStep.layer_caches`): pages admitted this step are copied into
their arena slots, streamed pages into staging; attention then reads resident pages in
place and staged ones from staging, run by run, merged by log-sum-exp (runner/ring_reads.py
builds those reads). New cells are written to their device copy and through to the pool
at the end of the step at the latest (`RingCells`), so the host copy is complete whenever
a conversation is parked, moved, saved or evicted. A write to pool cells that does not go
through the ring (a cell copy, a session restore) drops those pages from the arena.

With an accelerator the pool is pinned, copies are non-blocking on a side stream, each
layer's copies are issued while the previous layer computes (two staging buffers take
turns). On the CPU the arena and staging are still their own buffers and the same copies
happen, so the ring's behaviour and cost are real and testable here.

With layer groups (kv/groups.py) there is one ring per group (cells/ring_groups.py): a ring
serves its group's layers (`RingGroup`), keys its pages by that group's chunk ids, and a
windowed group's ring reads each lane's pages from its window's first page on only, dropping
the pages that fall behind (`_release_behind`). A page is admitted or staged with only the
cells some reading lane has committed (`_committed`; none: no copy): every later cell is
written (through the ring) before it is read, as no page is shared past a reader's commit
(kv/table.py: a fork shares full chunks within its cells only).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from strata.cells.protocol import Cells
from strata.cells.ring_cells import RingCells, StepState
from strata.cells.ring_counters import LaneRing, RingCounters, count_step
from strata.cells.ring_step import PageMap, RingStep, merge_runs
from strata.cells.storage import KVStorage
from strata.kv.residency import LaneReads, Residency
from strata.kv.ring_rule import RingSizing
from strata.kv.budget_rule import ring_ask
from strata.kv.groups import window_start
from strata.step import LaneWork

log = logging.getLogger("strata.ring")  # INFO: each sizing (the command line shows them, strata/cli.py)

@dataclass(frozen=True)
class RingGroup:
    """The layers one ring serves: layer group `index` (kv/groups.py), read through the lanes'
    `chunk_ids` (0: full attention) or `window_ids[index - 1]`, from the window's first page."""

    index: int
    layers: tuple[int, ...]
    window: int | None = None


class KVRing:
    def __init__(self, host: KVStorage, sizing: RingSizing, policy: str, budget_cells: int,
                 layer_devices: Sequence[torch.device], group: RingGroup | None = None,
                 copy_cells: Callable | None = None):
        """`group`: the layer group this ring serves (cells/ring_groups.py); None: every layer.
        `copy_cells`: the extension's page copy (csrc/copy_cells.cpp; CPU only), or None."""
        if host.chunk_size % sizing.page:
            raise ValueError(f"--kv-page {sizing.page} must divide --kv-chunk {host.chunk_size}")
        self.host = host
        self.group = group if group is not None else RingGroup(0, tuple(range(host.num_layers)))
        self.layers = self.group.layers
        self.window = self.group.window
        self.bytes_per_cell = host.group_bytes_per_cell(self.group.index)  # K and V of its layers
        self.sizing = sizing
        self.page = sizing.page
        self.policy = policy
        self.budget_cells = budget_cells
        self.num_slots = max(1, budget_cells // self.page)
        self.layer_devices = [torch.device(d) for d in layer_devices]
        self.devices = list(dict.fromkeys(self.layer_devices[i] for i in self.layers))
        self.rank = {layer: r for r, layer in enumerate(self.layers)}  # its layers in order (staging turns)
        self.step_state = {d: StepState() for d in self.devices}  # what its views on each device serve now
        self._make_arena()
        self.is_accelerated = any(d.type != "cpu" for d in self.devices)
        self.copy_cells = None if self.is_accelerated else copy_cells
        num_buffers = 2 if self.is_accelerated else 1
        self.staging: dict[torch.device, list[tuple[Cells, Cells] | None]] = {d: [None] * num_buffers
                                                                              for d in self.devices}
        self.residency = Residency(self.num_slots, policy)
        self.counters = RingCounters()
        self._last_reads: dict[int, tuple[str, tuple[int, ...]]] = {}  # lane -> (request, pages) of its last step
        self.budget = None  # --device-memory: the DeviceBudget that grants each lane's ring (moe/budget.py)
        self.on_split = None  # called with each new split, between steps (the expert slots follow it)
        host.write_listeners.append(self.on_host_write)

    def _make_arena(self) -> None:
        """Layer -> its arena [kv_heads, num_slots * page, head_dim] on its device (this ring's layers only)."""
        cells = self.num_slots * self.page
        self.arena_k = {i: self.host.k[i].zeros_like(cells, self.layer_devices[i]) for i in self.layers}
        self.arena_v = {i: self.host.v[i].zeros_like(cells, self.layer_devices[i]) for i in self.layers}
        self._views: dict[int, tuple[RingCells, RingCells]] = {}  # layer -> its K and V through this arena

    def staging_of(self, i: int) -> tuple[Cells, Cells]:
        """Layer i's staging buffer (K, V): its device's, consecutive layers taking turns where it has two."""
        buffers = self.staging[self.layer_devices[i]]
        return buffers[self.rank[i] % len(buffers)]

    def layer_views(self) -> dict[int, tuple[RingCells, RingCells]]:
        """Layer -> its K and V through the ring, kept while its arena and staging stay (a step
        points its device's `step_state` at its new cells)."""
        if len(self._views) != len(self.layers):
            for i in self.layers:
                k_stage, v_stage = self.staging_of(i)
                state = self.step_state[self.layer_devices[i]]
                self._views[i] = (RingCells(self.arena_k[i], k_stage, self.host.k[i], state),
                                  RingCells(self.arena_v[i], v_stage, self.host.v[i], state))
        return self._views

    # ---- the device budget (--device-memory) ------------------------------------------------------
    def attach_budget(self, budget, on_split) -> None:
        """From now on each lane's ring is what `budget` grants its request, and the arena holds
        exactly the busy lanes' rings; `on_split(split)` follows every change."""
        self.budget = budget
        self.on_split = on_split
        self.resize_arena(sum(budget.held.values()))

    def resize_arena(self, cells: int) -> None:
        """Between steps: an arena of `cells` (whole pages, at least one). Resident pages leave
        (the pool holds every cell), so the next step admits what it reads."""
        num_slots = max(1, -(-cells // self.page))
        if num_slots == self.num_slots:
            return
        self.counters.pages_invalidated += self.residency.num_resident
        self.num_slots = num_slots
        self.budget_cells = num_slots * self.page
        self._make_arena()
        self.residency = Residency(num_slots, self.policy)

    def _budget_lanes(self, work: Sequence[LaneWork], active: set[int]) -> None:
        """Lanes whose request ended give their rings back; lanes with a new request ask for one."""
        b = self.budget
        changed = False
        for lane in [n for n in b.held if n not in active]:
            changed |= b.finish(lane)
        for w in work:
            lane = self.counters.lanes.get(w.lane)
            if lane is not None and lane.request_id == w.request_id:
                continue
            if w.lane in b.held:
                changed |= b.finish(w.lane)
            ask = ring_ask(self.sizing, max(w.target_cells, w.num_cells), 0)
            changed |= b.admit(w.lane, ask)
            self.counters.sizings += 1
            if b.ring_cells(w.lane) < ask:
                self.counters.budget_fallbacks += 1
            if self.sizing.adaptive:
                log.info("KV ring adaptive: %d -> %d", self.sizing.cap, b.ring_cells(w.lane))
            self.counters.lanes[w.lane] = LaneRing(w.request_id, b.ring_cells(w.lane))
        if changed:
            self.resize_arena(sum(b.held.values()))
            self.on_split(b.split)

    # ---- sizing ---------------------------------------------------------------------------
    def lane_ring(self, w: LaneWork, active: set[int]) -> int:
        """The lane's ring in cells, sized once per request it serves (the rule, then the budget)."""
        lane = self.counters.lanes.get(w.lane)
        if lane is not None and lane.request_id == w.request_id:
            return lane.ring_cells
        s = self.sizing
        ring = s.ring_cells(max(w.target_cells, w.num_cells), 0)
        in_use = sum(r.ring_cells for n, r in self.counters.lanes.items() if n in active and n != w.lane)
        if ring > s.floor_cells and in_use + ring > self.budget_cells:
            ring = s.floor_cells
            self.counters.budget_fallbacks += 1
            log.info("KV ring budget: lane %d keeps %d cells (%d of %d in use)", w.lane, ring, in_use,
                     self.budget_cells)
        self.counters.sizings += 1
        if s.adaptive:
            log.info("KV ring adaptive: %d -> %d", s.cap, ring)
        self.counters.lanes[w.lane] = LaneRing(w.request_id, ring)
        return ring

    # ---- one step ---------------------------------------------------------------------------
    def first_page(self, w: LaneWork) -> int:
        """The lane's first page this ring reads: 0, or the page of its window's first position
        (kv/groups.py window_start of its first new token; a windowed table holds it onward)."""
        return 0 if self.window is None else window_start(w.start, self.window) // self.page

    def lane_pages(self, w: LaneWork) -> tuple[int, ...]:
        """Page keys of the lane's cells this ring reads: positions first_page * page .. num_cells-1,
        in position order, through its group's table; none for a ring of no layers."""
        if not self.layers:
            return ()
        per_chunk = self.host.chunk_size // self.page
        ids = w.chunk_ids if self.group.index == 0 else w.window_ids[self.group.index - 1]
        n = -(-w.num_cells // self.page)
        return tuple(ids[p // per_chunk] * per_chunk + p % per_chunk for p in range(self.first_page(w), n))

    def prepare(self, work: Sequence[LaneWork], host_write_index: torch.Tensor,
                busy_lanes: Iterable[int] = (), lane_rings: Sequence[int] | None = None) -> RingStep:
        """Residency for `work` (rows in order): what to copy, and where each page is read.
        `busy_lanes`: lanes serving a request, with or without work this step; their rings
        count against the budget (a lane whose request ended gives its ring back).
        `lane_rings`: each row's ring in cells, given (a windowed group follows the full group's
        sizing, cells/ring_groups.py); None: sized here. `host_write_index`: the new cells in
        this ring's group's pool, rows in order."""
        active = set(busy_lanes) | {w.lane for w in work}
        if lane_rings is None:
            if self.budget is not None:
                self._budget_lanes(work, active)
            lane_rings = [self.lane_ring(w, active) for w in work]
        else:
            self._follow(work, lane_rings)
        reads = [LaneReads(w.lane, self.sizing.pages(r), self.lane_pages(w)) for w, r in zip(work, lane_rings)]
        if self.window is not None:
            self._release_behind(work, reads)
        plan = self.residency.plan(reads)
        committed = self._committed(work, reads)
        arena_cells = self.num_slots * self.page
        start = {p: s * self.page for p, s in plan.slot_of.items()}
        start.update({p: arena_cells + i * self.page for i, p in enumerate(plan.streamed)})
        admit = merge_runs([(p * self.page, s * self.page, committed[p]) for p, s in plan.admitted if committed[p]])
        stage = merge_runs([(p * self.page, i * self.page, committed[p])
                            for i, p in enumerate(plan.streamed) if committed[p]])
        count_step(self.counters, work, reads, plan, sum(n for _, _, n in admit + stage) * self.bytes_per_cell)
        self._ensure_staging(len(plan.streamed) * self.page)
        where = PageMap(start, arena_cells)
        writes = []
        if self.layers:
            writes = [start[r.pages[pos // self.page - self.first_page(w)]] + pos % self.page
                      for w, r in zip(work, reads) for pos in range(w.start, w.num_cells)]
        return RingStep(self, where, admit, stage, host_write_index, writes, plan)

    def _follow(self, work: Sequence[LaneWork], lane_rings: Sequence[int]) -> None:
        for w, ring in zip(work, lane_rings):
            lane = self.counters.lanes.get(w.lane)
            if lane is None or lane.request_id != w.request_id:
                self.counters.lanes[w.lane] = LaneRing(w.request_id, ring)
            else:
                lane.ring_cells = ring

    def _release_behind(self, work: Sequence[LaneWork], reads: Sequence[LaneReads]) -> None:
        """A windowed ring: pages a lane read in its last step of the same request and reads no
        more fell behind its window (only a branch reads them again): they leave the arena, so the
        pages entering windows take their slots rather than idle conversations' windows."""
        now = {p for r in reads for p in r.pages}
        behind: list[int] = []
        for w, r in zip(work, reads):
            last = self._last_reads.get(w.lane)
            if last is not None and last[0] == w.request_id:
                behind += [p for p in last[1] if p not in now]
            self._last_reads[w.lane] = (w.request_id, r.pages)
        self.counters.pages_released += self.residency.invalidate(behind)

    def _committed(self, work: Sequence[LaneWork], reads: Sequence[LaneReads]) -> dict[int, int]:
        """Page -> its leading cells that hold a committed position of some lane reading it: the
        only cells a copy of it needs (the rest are written this step, or later, before any read)."""
        committed: dict[int, int] = {}
        for w, r in zip(work, reads):
            first = self.first_page(w)
            for i, p in enumerate(r.pages):
                n = min(self.page, max(0, w.start - (first + i) * self.page))
                committed[p] = max(committed.get(p, 0), n)
        return committed

    def _ensure_staging(self, cells: int) -> None:
        cells = max(cells, self.page)
        for dev, buffers in self.staging.items():
            for b, buf in enumerate(buffers):
                if buf is None or buf[0].shape[1] < cells:
                    grown = max(cells, 2 * buf[0].shape[1]) if buf is not None else cells
                    first = self.layers[0]
                    buffers[b] = (self.host.k[first].zeros_like(grown, dev),
                                  self.host.v[first].zeros_like(grown, dev))
                    self._views = {}  # the layers' views name the old buffer

    def abort(self, step: RingStep) -> None:
        """The step failed part way: its admitted pages may be partly copied, so they leave."""
        self.counters.pages_invalidated += self.residency.invalidate(p for p, _ in step.plan.admitted)

    def on_host_write(self, flat_cell: int, num_cells: int, group: int = 0) -> None:
        """Pool cells of layer group `group` were written outside the ring (a copy, a restore):
        this ring's pages of them leave the arena."""
        if num_cells <= 0 or group != self.group.index:
            return
        first, last = flat_cell // self.page, (flat_cell + num_cells - 1) // self.page
        self.counters.pages_invalidated += self.residency.invalidate(range(first, last + 1))

    # ---- what users see -----------------------------------------------------------------------
    def stats(self) -> dict:
        return {"kv_resident": self.sizing.cap, "page": self.page, "evict": self.policy,
                "adaptive": self.sizing.adaptive, "budget_cells": self.budget_cells, "arena_pages": self.num_slots,
                "resident_pages": self.residency.num_resident, **self.counters.stats(),
                "bytes_per_page": self.page * self.bytes_per_cell}

    def lane_stats(self, lane: int) -> dict | None:
        r = self.counters.lanes.get(lane)
        return None if r is None else r.stats()

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
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from strata.cells.protocol import Cells
from strata.cells.ring_step import PageMap, RingStep
from strata.cells.storage import KVStorage
from strata.kv.residency import LaneReads, Residency, ResidencyPlan
from strata.kv.ring_rule import RingSizing
from strata.kv.budget_rule import ring_ask
from strata.step import LaneWork

log = logging.getLogger("strata.ring")  # INFO: each sizing (the command line shows them, strata/cli.py)

def merge_runs(pairs: Sequence[tuple[int, int]], length: int) -> list[tuple[int, int, int]]:
    """(src, dst) starts of `length`-cell blocks -> (src, dst, cells) runs, joining blocks that continue each other."""
    runs: list[list[int]] = []
    for src, dst in sorted(pairs):
        if runs and runs[-1][0] + runs[-1][2] == src and runs[-1][1] + runs[-1][2] == dst:
            runs[-1][2] += length
        else:
            runs.append([src, dst, length])
    return [tuple(r) for r in runs]


@dataclass
class LaneRing:
    """One lane's ring and what it read (totals since start)."""

    request_id: str
    ring_cells: int
    resident_pages: int = 0  # of its conversation, after the last step's admissions
    pages_read: int = 0
    pages_in_place: int = 0  # read where they were resident
    pages_streamed: int = 0  # read through staging
    pages_admitted: int = 0


@dataclass
class RingCounters:
    tokens: int = 0  # cells written through the ring
    page_reads: int = 0  # lane-page reads
    page_hits: int = 0  # ... of pages resident before the step
    pages_streamed: int = 0  # pages copied into staging (each once per step)
    pages_admitted: int = 0  # pages copied into the arena
    pages_invalidated: int = 0
    bytes_copied: int = 0  # host -> device, every layer, staging and admissions
    sizings: int = 0
    budget_fallbacks: int = 0  # lanes that kept the floor ring because the budget was spent
    lanes: dict[int, LaneRing] = field(default_factory=dict)


class KVRing:
    def __init__(self, host: KVStorage, sizing: RingSizing, policy: str, budget_cells: int,
                 layer_devices: Sequence[torch.device]):
        if host.chunk_size % sizing.page:
            raise ValueError(f"--kv-page {sizing.page} must divide --kv-chunk {host.chunk_size}")
        self.host = host
        self.sizing = sizing
        self.page = sizing.page
        self.policy = policy
        self.budget_cells = budget_cells
        self.num_slots = max(1, budget_cells // self.page)
        self.layer_devices = [torch.device(d) for d in layer_devices]
        self.devices = list(dict.fromkeys(self.layer_devices))
        arena_cells = self.num_slots * self.page
        self.arena_k = [k.zeros_like(arena_cells, d) for k, d in zip(host.k, self.layer_devices)]
        self.arena_v = [v.zeros_like(arena_cells, d) for v, d in zip(host.v, self.layer_devices)]
        self.is_accelerated = any(d.type != "cpu" for d in self.devices)
        num_buffers = 2 if self.is_accelerated else 1
        self.staging: dict[torch.device, list[tuple[Cells, Cells] | None]] = {d: [None] * num_buffers
                                                                              for d in self.devices}
        self.residency = Residency(self.num_slots, policy)
        self.counters = RingCounters()
        self.budget = None  # --device-memory: the DeviceBudget that grants each lane's ring (moe/budget.py)
        self.on_split = None  # called with each new split, between steps (the expert slots follow it)
        host.write_listeners.append(self.on_host_write)

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
        self.arena_k = [k.zeros_like(self.budget_cells, d) for k, d in zip(self.host.k, self.layer_devices)]
        self.arena_v = [v.zeros_like(self.budget_cells, d) for v, d in zip(self.host.v, self.layer_devices)]
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
    def lane_pages(self, w: LaneWork) -> tuple[int, ...]:
        """Page keys of the lane's cells 0..num_cells-1, in position order."""
        per_chunk = self.host.chunk_size // self.page
        n = -(-w.num_cells // self.page)
        return tuple(w.chunk_ids[p // per_chunk] * per_chunk + p % per_chunk for p in range(n))

    def prepare(self, work: Sequence[LaneWork], host_write_index: torch.Tensor,
                busy_lanes: Iterable[int] = ()) -> RingStep:
        """Residency for `work` (rows in order): what to copy, and where each page is read.
        `busy_lanes`: lanes serving a request, with or without work this step; their rings
        count against the budget (a lane whose request ended gives its ring back)."""
        active = set(busy_lanes) | {w.lane for w in work}
        if self.budget is not None:
            self._budget_lanes(work, active)
        reads = [LaneReads(w.lane, self.sizing.pages(self.lane_ring(w, active)), self.lane_pages(w)) for w in work]
        plan = self.residency.plan(reads)
        self._count(work, reads, plan)
        arena_cells = self.num_slots * self.page
        start = {p: s * self.page for p, s in plan.slot_of.items()}
        start.update({p: arena_cells + i * self.page for i, p in enumerate(plan.streamed)})
        admit = merge_runs([(p * self.page, s * self.page) for p, s in plan.admitted], self.page)
        stage = merge_runs([(p * self.page, i * self.page) for i, p in enumerate(plan.streamed)], self.page)
        self._ensure_staging(len(plan.streamed) * self.page)
        where = PageMap(start, arena_cells)
        writes = [start[r.pages[pos // self.page]] + pos % self.page
                  for w, r in zip(work, reads) for pos in range(w.start, w.num_cells)]
        return RingStep(self, where, admit, stage, host_write_index, torch.tensor(writes, dtype=torch.long), plan)

    def _count(self, work: Sequence[LaneWork], reads: Sequence[LaneReads], plan: ResidencyPlan) -> None:
        c = self.counters
        for w, r, lr in zip(work, reads, plan.lanes):
            lane = c.lanes[w.lane]
            lane.pages_read += len(r.pages)
            lane.pages_in_place += lr.resident
            lane.pages_streamed += lr.streamed
            lane.pages_admitted += lr.admitted
            lane.resident_pages = sum(1 for p in r.pages if p in plan.slot_of)
            c.tokens += len(w.token_ids)
            c.page_reads += len(r.pages)
            c.page_hits += lr.resident
        c.pages_streamed += len(plan.streamed)
        c.pages_admitted += len(plan.admitted)
        c.bytes_copied += (len(plan.streamed) + len(plan.admitted)) * self.page * self.host.bytes_per_cell

    def _ensure_staging(self, cells: int) -> None:
        cells = max(cells, self.page)
        for dev, buffers in self.staging.items():
            for b, buf in enumerate(buffers):
                if buf is None or buf[0].shape[1] < cells:
                    grown = max(cells, 2 * buf[0].shape[1]) if buf is not None else cells
                    buffers[b] = (self.host.k[0].zeros_like(grown, dev), self.host.v[0].zeros_like(grown, dev))

    def abort(self, step: RingStep) -> None:
        """The step failed part way: its admitted pages may be partly copied, so they leave."""
        self.counters.pages_invalidated += self.residency.invalidate(p for p, _ in step.plan.admitted)

    def on_host_write(self, flat_cell: int, num_cells: int) -> None:
        """Pool cells were written outside the ring (a copy, a restore): their pages leave the arena."""
        if num_cells <= 0:
            return
        first, last = flat_cell // self.page, (flat_cell + num_cells - 1) // self.page
        self.counters.pages_invalidated += self.residency.invalidate(range(first, last + 1))

    # ---- what users see -----------------------------------------------------------------------
    def stats(self) -> dict:
        c = self.counters
        bytes_per_page = self.page * self.host.bytes_per_cell
        return {
            "kv_resident": self.sizing.cap,
            "page": self.page,
            "evict": self.policy,
            "adaptive": self.sizing.adaptive,
            "budget_cells": self.budget_cells,
            "arena_pages": self.num_slots,
            "resident_pages": self.residency.num_resident,
            "pages_streamed": c.pages_streamed,
            "pages_admitted": c.pages_admitted,
            "bytes_streamed": c.bytes_copied,
            "bytes_streamed_per_token": c.bytes_copied / c.tokens if c.tokens else 0.0,
            "pages_streamed_per_token": (c.pages_streamed + c.pages_admitted) / c.tokens if c.tokens else 0.0,
            "hit_ratio": c.page_hits / c.page_reads if c.page_reads else 0.0,
            "sizings": c.sizings,
            "budget_fallbacks": c.budget_fallbacks,
            "bytes_per_page": bytes_per_page,
        }

    def lane_stats(self, lane: int) -> dict | None:
        r = self.counters.lanes.get(lane)
        if r is None:
            return None
        return {"ring_cells": r.ring_cells, "resident_pages": r.resident_pages, "pages_read": r.pages_read,
                "pages_streamed": r.pages_streamed + r.pages_admitted,
                "hit_ratio": r.pages_in_place / r.pages_read if r.pages_read else 0.0}

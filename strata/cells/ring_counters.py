"""The resident ring's counters (cells/ring.py): per lane and in all, what was read and copied. No torch here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from strata.kv.residency import LaneReads, ResidencyPlan
from strata.step import LaneWork


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

    def stats(self) -> dict:
        return {"ring_cells": self.ring_cells, "resident_pages": self.resident_pages, "pages_read": self.pages_read,
                "pages_streamed": self.pages_streamed + self.pages_admitted,
                "hit_ratio": self.pages_in_place / self.pages_read if self.pages_read else 0.0}


@dataclass
class RingCounters:
    tokens: int = 0  # cells written through the ring
    page_reads: int = 0  # lane-page reads
    page_hits: int = 0  # ... of pages resident before the step
    pages_streamed: int = 0  # pages copied into staging (each once per step)
    pages_admitted: int = 0  # pages copied into the arena
    pages_invalidated: int = 0
    pages_released: int = 0  # a windowed ring's pages that fell behind every window reading them
    bytes_copied: int = 0  # host -> device, every layer, staging and admissions
    sizings: int = 0
    budget_fallbacks: int = 0  # lanes that kept the floor ring because the budget was spent
    lanes: dict[int, LaneRing] = field(default_factory=dict)

    def stats(self) -> dict:
        """What was read and copied in all (the ring's stats beside its sizes)."""
        def per_token(n: int) -> float:
            return n / self.tokens if self.tokens else 0.0

        return {
            "pages_streamed": self.pages_streamed,
            "pages_admitted": self.pages_admitted,
            "bytes_streamed": self.bytes_copied,
            "bytes_streamed_per_token": per_token(self.bytes_copied),
            "pages_streamed_per_token": per_token(self.pages_streamed + self.pages_admitted),
            "hit_ratio": self.page_hits / self.page_reads if self.page_reads else 0.0,
            "sizings": self.sizings,
            "budget_fallbacks": self.budget_fallbacks,
        }


def count_step(c: RingCounters, work: Sequence[LaneWork], reads: Sequence[LaneReads], plan: ResidencyPlan,
               bytes_copied: int) -> None:
    """One step's reads, and the bytes its copies move (only committed cells: cells/ring.py `_committed`)."""
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
    c.bytes_copied += bytes_copied

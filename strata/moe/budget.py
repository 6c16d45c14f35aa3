"""The device budget's bookkeeping: which lane holds which ring, how many expert slots are
left (kv/budget_rule.py's rule), and the split's log line, once per change.

`strata generate` admits its one run (`admit(0, ask)`) and keeps that split; `strata serve`
admits each request as it takes a lane and finishes it when the request ends, and the
caller applies `split` (CachedBank.resize, the rings) between steps whenever `admit` or
`finish` says it changed. No torch here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from strata.kv.budget_rule import MIB, BudgetShape, BudgetSplit, grant, split

log = logging.getLogger("strata.budget")  # INFO: each change of the split (the command line shows them)


@dataclass
class BudgetCounters:
    admissions: int = 0
    finishes: int = 0
    changes: int = 0  # splits that differed from the one before
    fallbacks: int = 0  # lanes that asked above the floor and kept the floor
    min_slots_seen: int = 0  # the fewest expert slots any split left


class DeviceBudget:
    def __init__(self, shape: BudgetShape):
        self.shape = shape
        self.held: dict[int, int] = {}  # busy lane -> its ring's cells, in admission order
        self.counters = BudgetCounters()
        self.split: BudgetSplit = split(shape, self.held)
        self.counters.min_slots_seen = self.split.expert_slots
        self._log()

    def admit(self, lane: int, ask: int) -> bool:
        """A request takes `lane`, asking for `ask` cells of ring; returns whether the split
        changed. The lane's ring is then `ring_cells(lane)` until `finish(lane)`."""
        assert lane not in self.held, f"lane {lane} holds a ring already"
        assert len(self.held) < max(1, self.shape.num_lanes)
        cells = grant(self.shape, self.held, ask)
        if cells < ask:
            self.counters.fallbacks += 1
        self.held[lane] = cells
        self.counters.admissions += 1
        return self._resplit()

    def finish(self, lane: int) -> bool:
        """The lane's request ended: its ring goes back. Returns whether the split changed."""
        if self.held.pop(lane, None) is None:
            return False
        self.counters.finishes += 1
        return self._resplit()

    def ring_cells(self, lane: int) -> int:
        return self.held[lane]

    def _resplit(self) -> bool:
        new = split(self.shape, self.held)
        changed = (new.expert_slots, new.ring_bytes) != (self.split.expert_slots, self.split.ring_bytes)
        self.split = new
        self.counters.min_slots_seen = min(self.counters.min_slots_seen, new.expert_slots)
        if changed:
            self.counters.changes += 1
            self._log()
        return changed

    def _log(self) -> None:
        s, sh = self.split, self.shape
        log.info("device budget: %d expert slots per layer (%.0f MiB), rings %s cells (%.0f MiB), "
                 "resident weights %.0f MiB, of %.0f MiB", s.expert_slots, s.expert_bytes / MIB,
                 "+".join(str(c) for _, c in s.ring_cells) or "0", s.ring_bytes / MIB, sh.resident_bytes / MIB,
                 sh.device_bytes / MIB)

    def used_bytes(self) -> int:
        return self.shape.resident_bytes + self.split.expert_bytes + self.split.ring_bytes

    def stats(self) -> dict:
        s, sh, c = self.split, self.shape, self.counters
        return {
            "device_bytes": sh.device_bytes, "resident_bytes": sh.resident_bytes,
            "expert_slots": s.expert_slots, "expert_bytes": s.expert_bytes,
            "ring_cells": {str(lane): cells for lane, cells in s.ring_cells}, "ring_bytes": s.ring_bytes,
            "free_bytes": sh.device_bytes - self.used_bytes(),
            "min_slots": sh.min_slots, "max_slots": sh.max_slots, "floor_cells": sh.floor_cells,
            "admissions": c.admissions, "finishes": c.finishes, "changes": c.changes,
            "fallbacks": c.fallbacks, "min_slots_seen": c.min_slots_seen,
        }

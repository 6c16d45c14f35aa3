"""One MoE layer's expert slots: which expert each slot holds, and what each run does.

Per step: `begin(experts)` with the step's distinct experts in run order, then `take(e, copy)`
for each as it runs, which answers where `e` runs:
- a resident expert runs from its slot (a hit);
- a missing one (a miss) is copied into a slot when `copy` is true and a slot can be had:
  the lowest free slot, else the policy's victim among resident experts the step does not
  still need (experts that already ran this step may give way: a step with more distinct
  experts than slots runs in waves); otherwise it runs where it lives (host memory).
So `take` never displaces an expert the step has yet to run, and every expert runs exactly
once per `begin`. `hint(experts)` (prefetch) copies missing experts into slots ahead of
their step, displacing only experts no begun step still needs. `resize(n)` changes the
number of slots between steps: victims leave until n hold experts, then experts in slots
past n move down into free ones.

No torch here: CachedBank (cache.py) applies the copies; the counters are kept here.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from strata.moe.evict import ExpertPolicy, make_expert_policy


@dataclass(frozen=True)
class Take:
    slot: int | None  # where the expert runs; None: where it lives
    hit: bool  # it was resident (placed by an earlier step or a prefetch)
    evicted: int | None = None  # the expert whose slot it took (copy into `slot` first)

    @property
    def copied(self) -> bool:
        return self.slot is not None and not self.hit


@dataclass
class SlotCounters:
    runs: int = 0  # experts run (one per take)
    rows: int = 0  # rows routed to them
    hits: int = 0
    misses: int = 0  # copies + host runs
    host_runs: int = 0  # misses run where the expert lives
    copies: int = 0  # experts copied into a slot on a miss
    evictions: int = 0  # experts displaced (by a miss or a prefetch)
    prefetches: int = 0  # experts copied ahead by `hint`
    prefetch_hits: int = 0  # hits on an expert a prefetch placed, first use only
    prefetch_wasted: int = 0  # prefetched experts displaced before any use

    def add(self, other: SlotCounters) -> None:
        for k, v in vars(other).items():
            setattr(self, k, getattr(self, k) + v)


class ExpertSlots:
    def __init__(self, num_slots: int, policy: str | ExpertPolicy):
        assert num_slots >= 0
        self.expert_of_slot: list[int | None] = [None] * num_slots
        self.slot_of: dict[int, int] = {}
        self._free = list(range(num_slots))  # a heap: the lowest free slot first
        self.policy = make_expert_policy(policy) if isinstance(policy, str) else policy
        self.step = 0
        self.pending: set[int] = set()  # experts of the begun step not yet run
        self.prefetched: set[int] = set()  # placed by hint, not used since
        self.counters = SlotCounters()

    @property
    def num_slots(self) -> int:
        return len(self.expert_of_slot)

    def begin(self, experts: Sequence[int]) -> None:
        """A new step (a step that failed part way leaves experts it never ran: they are dropped)."""
        assert len(set(experts)) == len(experts), "a step names each expert once"
        self.step += 1
        self.pending = set(experts)

    def take(self, expert: int, copy: bool, rows: int = 1) -> Take:
        assert expert in self.pending, f"expert {expert} was not planned for this step, or ran already"
        self.pending.discard(expert)
        c = self.counters
        c.runs += 1
        c.rows += rows
        slot = self.slot_of.get(expert)
        if slot is not None:
            c.hits += 1
            if expert in self.prefetched:
                self.prefetched.discard(expert)
                c.prefetch_hits += 1
            self.policy.used(expert, self.step)
            return Take(slot, hit=True)
        c.misses += 1
        got = self._slot_for(self.pending) if copy else None
        if got is None:
            c.host_runs += 1
            self.policy.used(expert, self.step)
            return Take(None, hit=False)
        slot, evicted = got
        self._place(expert, slot)
        c.copies += 1
        self.policy.used(expert, self.step)
        return Take(slot, hit=False, evicted=evicted)

    def hint(self, experts: Sequence[int]) -> list[Take]:
        """Prefetch: copy the missing ones of `experts` (most likely first) into slots; returns
        the copies to make, in order. Experts named by the begun step are never displaced, nor
        are the hinted ones already placed."""
        keep = set(self.pending) | {e for e in experts if e in self.slot_of}
        out = []
        for e in dict.fromkeys(experts):
            if e in self.slot_of:
                continue
            got = self._slot_for(keep)
            if got is None:
                break
            slot, evicted = got
            self._place(e, slot)
            self.prefetched.add(e)
            keep.add(e)
            self.counters.prefetches += 1
            out.append(Take(slot, hit=False, evicted=evicted))
        return out

    def _slot_for(self, keep: set[int]) -> tuple[int, int | None] | None:
        if self._free:
            return heapq.heappop(self._free), None
        victim = self.policy.victim((e for e in self.slot_of if e not in keep), self.step)
        if victim is None:
            return None
        slot = self._drop(victim)
        return slot, victim

    def _place(self, expert: int, slot: int) -> None:
        self.expert_of_slot[slot] = expert
        self.slot_of[expert] = slot
        self.policy.placed(expert, self.step)

    def forget(self, expert: int) -> None:
        """`expert`'s slot no longer holds its weights (a copy into it failed part way)."""
        if expert in self.slot_of:
            heapq.heappush(self._free, self._drop(expert))

    def _drop(self, expert: int) -> int:
        """`expert` leaves its slot (counted as an eviction); returns the slot, not freed."""
        slot = self.slot_of.pop(expert)
        self.expert_of_slot[slot] = None
        self.policy.removed(expert)
        self.counters.evictions += 1
        if expert in self.prefetched:
            self.prefetched.discard(expert)
            self.counters.prefetch_wasted += 1
        return slot

    def resize(self, num_slots: int) -> list[tuple[int, int]]:
        """Between steps: keep `num_slots` slots. Returns the moves (from slot, to slot) to
        apply before the slots past `num_slots` are released; growing returns none."""
        assert num_slots >= 0
        self.pending = set()  # between steps: nothing is still to run
        n = self.num_slots
        if num_slots >= n:
            self.expert_of_slot += [None] * (num_slots - n)
            for s in range(n, num_slots):
                heapq.heappush(self._free, s)
            return []
        while len(self.slot_of) > num_slots:
            heapq.heappush(self._free, self._drop(self.policy.victim(self.slot_of, self.step)))
        free = sorted(s for s in self._free if s < num_slots)
        moves = []
        for s in range(num_slots, n):
            e = self.expert_of_slot[s]
            if e is not None:
                to = free.pop(0)
                self.expert_of_slot[to], self.slot_of[e] = e, to
                moves.append((s, to))
        del self.expert_of_slot[num_slots:]
        self._free = free
        heapq.heapify(self._free)
        return moves

    def check(self) -> None:
        assert len(self.slot_of) + len(self._free) == self.num_slots
        assert len(set(self._free)) == len(self._free) and all(0 <= s < self.num_slots for s in self._free)
        for e, s in self.slot_of.items():
            assert self.expert_of_slot[s] == e
        assert all(self.expert_of_slot[s] is None for s in self._free)
        assert self.prefetched <= set(self.slot_of)

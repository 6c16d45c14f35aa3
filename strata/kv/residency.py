"""Which pages of the pool are resident in the ring's device arena (`--kv-evict clock|lrfu`).

A page is `--kv-page` consecutive cells of one chunk; its key is its flat page number in
the pool (flat cell // page), so a page that several conversations share (a common
prefix) has one key and is resident once. The arena has a fixed number of slots.

Each step every lane reads every page of its conversation (exact attention), so the
plan for a step is:
- every resident page some lane reads is pinned: it cannot be displaced this step;
- a lane whose resident pages number fewer than its ring admits its missing pages in
  position order into a free slot, or into a victim's slot when the policy names one
  (only pages no lane reads this step can be victims, and LRFU may refuse the swap);
- any other missing page is streamed: copied into staging for this step only, without
  displacing a resident page. On a cyclic scan larger than the ring (the classic
  LRU-on-a-loop failure) the resident pages therefore stay and only the excess streams.

Policies choose victims among unpinned resident pages (pages of conversations that no
lane reads now: parked, finished, moved out of the ring's reach):
- `clock`: second chance; every read sets a page's bit, the hand clears set bits and
  takes the first page whose bit is clear.
- `lrfu`: the page with the smallest combined recency-frequency value
  CRF = sum over its reads of 2 ** (-LAMBDA * age in steps) (a read by each of n lanes
  in one step counts n times), and a missing page displaces it only if its own CRF is
  at least as large; reads of streamed pages are remembered (a bounded history) so a
  page that is read often earns its place.

No torch here.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

POLICIES = ("clock", "lrfu")
LRFU_LAMBDA = 0.1  # a page read every step settles at CRF ~14.9; unread, it halves every 10 steps


@dataclass(frozen=True)
class LaneReads:
    lane: int
    ring_pages: int  # at most this many of its pages resident
    pages: tuple[int, ...]  # page keys it reads this step, in position order


@dataclass(frozen=True)
class LaneResidency:
    lane: int
    resident: int  # pages read in place (resident before this step)
    admitted: int  # pages copied into the arena this step (then read in place)
    streamed: int  # pages read from staging this step


@dataclass(frozen=True)
class ResidencyPlan:
    slot_of: dict[int, int]  # every page read this step that is resident after admission -> slot
    admitted: tuple[tuple[int, int], ...]  # (page, slot): copy the page into the slot first
    evicted: tuple[int, ...]  # pages whose slots were taken
    streamed: tuple[int, ...]  # pages read through staging, each once, in first-read order
    lanes: tuple[LaneResidency, ...] = field(default=())


class Policy(ABC):
    @abstractmethod
    def read(self, page: int, slot: int | None, now: int) -> None:
        """A lane reads `page` this step (`slot` None: it is not resident)."""

    @abstractmethod
    def victim(self, page_of_slot: Sequence[int | None], pinned: set[int], now: int) -> int | None:
        """The slot whose page gives way, among resident pages not in `pinned`; None: none may."""

    def admits(self, page: int, victim_page: int, now: int) -> bool:
        """Whether `page` may displace `victim_page` (both chosen already)."""
        return True

    def forget(self, page: int, slot: int) -> None:
        """`page` left `slot` (evicted or invalidated)."""

    def placed(self, page: int, slot: int, now: int) -> None:
        """`page` now occupies `slot`."""


class ClockPolicy(Policy):
    def __init__(self, num_slots: int):
        self.bits = [False] * num_slots
        self.hand = 0

    def read(self, page: int, slot: int | None, now: int) -> None:
        if slot is not None:
            self.bits[slot] = True

    def placed(self, page: int, slot: int, now: int) -> None:
        self.bits[slot] = True

    def forget(self, page: int, slot: int) -> None:
        self.bits[slot] = False

    def victim(self, page_of_slot: Sequence[int | None], pinned: set[int], now: int) -> int | None:
        n = len(page_of_slot)
        for _ in range(2 * n):  # a second lap finds the bits the first one cleared
            slot = self.hand
            self.hand = (self.hand + 1) % n
            page = page_of_slot[slot]
            if page is None or page in pinned:
                continue
            if self.bits[slot]:
                self.bits[slot] = False
                continue
            return slot
        return None


class LRFUPolicy(Policy):
    def __init__(self, num_slots: int, lam: float = LRFU_LAMBDA, history: int | None = None):
        self.lam = lam
        self.crf: OrderedDict[int, tuple[float, int]] = OrderedDict()  # page -> (CRF at `last`, last)
        self.history = history if history is not None else 4 * num_slots + 64
        self.resident: set[int] = set()

    def value(self, page: int, now: int) -> float:
        crf, last = self.crf.get(page, (0.0, now))
        return crf * 2.0 ** (-self.lam * (now - last))

    def read(self, page: int, slot: int | None, now: int) -> None:
        self.crf[page] = (1.0 + self.value(page, now), now)
        self.crf.move_to_end(page)
        while len(self.crf) > self.history + len(self.resident):  # forget the oldest non-resident history
            old = next(p for p in self.crf if p not in self.resident)
            del self.crf[old]

    def placed(self, page: int, slot: int, now: int) -> None:
        self.resident.add(page)

    def forget(self, page: int, slot: int) -> None:
        self.resident.discard(page)

    def victim(self, page_of_slot: Sequence[int | None], pinned: set[int], now: int) -> int | None:
        best = None
        for slot, page in enumerate(page_of_slot):
            if page is None or page in pinned:
                continue
            key = (self.value(page, now), self.crf.get(page, (0.0, -1))[1], slot)  # ties: least recent, lowest slot
            if best is None or key < best[0]:
                best = (key, slot)
        return None if best is None else best[1]

    def admits(self, page: int, victim_page: int, now: int) -> bool:
        return self.value(page, now) >= self.value(victim_page, now)


def make_policy(name: str, num_slots: int) -> Policy:
    if name == "clock":
        return ClockPolicy(num_slots)
    if name == "lrfu":
        return LRFUPolicy(num_slots)
    raise ValueError(f"unknown residency policy {name!r}")


class Residency:
    """The arena's slots: which page each holds, and the plan of each step."""

    def __init__(self, num_slots: int, policy: str):
        assert num_slots >= 1
        self.page_of_slot: list[int | None] = [None] * num_slots
        self.slot_of: dict[int, int] = {}
        self._free = list(range(num_slots))  # a heap: the lowest free slot first, so a lane's pages sit together
        self.policy = make_policy(policy, num_slots)
        self.now = 0

    @property
    def num_slots(self) -> int:
        return len(self.page_of_slot)

    @property
    def num_resident(self) -> int:
        return len(self.slot_of)

    def plan(self, lanes: Sequence[LaneReads]) -> ResidencyPlan:
        self.now += 1
        now = self.now
        pinned = {p for ln in lanes for p in ln.pages if p in self.slot_of}
        for ln in lanes:
            for p in ln.pages:
                self.policy.read(p, self.slot_of.get(p), now)
        admitted: list[tuple[int, int]] = []
        evicted: list[int] = []
        streamed: dict[int, None] = {}
        per_lane = []
        before = set(self.slot_of)
        for ln in lanes:
            used = sum(1 for p in ln.pages if p in self.slot_of)
            n_adm = n_str = 0
            for p in ln.pages:
                if p in self.slot_of:
                    continue
                slot = self._slot_for(p, pinned, evicted) if used < ln.ring_pages else None
                if slot is None:
                    streamed.setdefault(p)
                    n_str += 1
                    continue
                self._place(p, slot)
                pinned.add(p)
                admitted.append((p, slot))
                used += 1
                n_adm += 1
            n_res = sum(1 for p in ln.pages if p in before)
            per_lane.append(LaneResidency(ln.lane, n_res, n_adm, n_str))
        slot_of = {p: self.slot_of[p] for ln in lanes for p in ln.pages if p in self.slot_of}
        return ResidencyPlan(slot_of, tuple(admitted), tuple(evicted), tuple(streamed), tuple(per_lane))

    def _slot_for(self, page: int, pinned: set[int], evicted: list[int]) -> int | None:
        if self._free:
            return heapq.heappop(self._free)
        slot = self.policy.victim(self.page_of_slot, pinned, self.now)
        if slot is None:
            return None
        victim = self.page_of_slot[slot]
        assert victim is not None and victim not in pinned
        if not self.policy.admits(page, victim, self.now):
            return None
        self._drop(victim, to_free=False)  # its slot goes straight to `page`
        evicted.append(victim)
        return slot

    def _place(self, page: int, slot: int) -> None:
        self.page_of_slot[slot] = page
        self.slot_of[page] = slot
        self.policy.placed(page, slot, self.now)

    def _drop(self, page: int, to_free: bool = True) -> None:
        slot = self.slot_of.pop(page)
        self.page_of_slot[slot] = None
        self.policy.forget(page, slot)
        if to_free:
            heapq.heappush(self._free, slot)

    def invalidate(self, pages: Iterable[int]) -> int:
        """Pages whose host cells were written outside the ring leave it; returns how many did."""
        n = 0
        for p in pages:
            if p in self.slot_of:
                self._drop(p)
                n += 1
        return n

    def check(self) -> None:
        assert len(self.slot_of) + len(self._free) == self.num_slots
        assert sorted(self._free) == sorted(set(self._free))
        for p, s in self.slot_of.items():
            assert self.page_of_slot[s] == p
        assert all(self.page_of_slot[s] is None for s in self._free)

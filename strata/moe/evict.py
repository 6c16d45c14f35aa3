"""Which cached expert gives its slot to a missing one (`--moe-evict lru|lfu|lrfu`).

One policy per MoE layer; it sees every use of an expert in that layer (`used`, with the
layer's step number) and every placement and removal, and names a victim among the
resident experts it is offered (the caller never offers an expert the step still needs):
- `lru`: the expert used least recently (a prefetched expert counts as used when placed).
- `lfu`: the fewest uses since it was last placed in a slot (in-cache LFU), ties the least
  recently used.
- `lrfu`: the smallest combined recency-frequency value, CRF = sum over its uses of
  2 ** (-LAMBDA * age in steps), remembered across evictions (as kv/residency.py's lrfu);
  ties the least recently used.
Ties left after those go to the lowest expert id, so every policy is deterministic.

No torch here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

EVICT_POLICIES = ("lru", "lfu", "lrfu")
DEFAULT_EVICT = "lrfu"  # chosen on benchmarks/moe_cache.py's traces (docs/moe-cache.md)
LRFU_LAMBDA = 0.5  # a use halves in weight every 2 steps


class ExpertPolicy(ABC):
    def __init__(self) -> None:
        self.clock = 0  # uses so far: orders uses within a step
        self.last: dict[int, int] = {}  # expert -> clock of its last use or placement

    def used(self, expert: int, step: int) -> None:
        """The step ran `expert` (from a slot or where it lives)."""
        self.clock += 1
        self.last[expert] = self.clock

    def placed(self, expert: int, step: int) -> None:
        """`expert` now occupies a slot."""
        self.clock += 1
        self.last[expert] = self.clock

    def removed(self, expert: int) -> None:
        """`expert` left its slot."""

    @abstractmethod
    def key(self, expert: int, step: int) -> tuple:
        """Smaller keys give way first."""

    def victim(self, candidates: Iterable[int], step: int) -> int | None:
        return min(candidates, key=lambda e: (*self.key(e, step), e), default=None)


class LRUPolicy(ExpertPolicy):
    def key(self, expert: int, step: int) -> tuple:
        return (self.last.get(expert, 0),)


class LFUPolicy(ExpertPolicy):
    def __init__(self) -> None:
        super().__init__()
        self.uses: dict[int, int] = {}  # resident experts only: uses since placed

    def used(self, expert: int, step: int) -> None:
        super().used(expert, step)
        if expert in self.uses:
            self.uses[expert] += 1

    def placed(self, expert: int, step: int) -> None:
        super().placed(expert, step)
        self.uses[expert] = 0

    def removed(self, expert: int) -> None:
        self.uses.pop(expert, None)

    def key(self, expert: int, step: int) -> tuple:
        return (self.uses.get(expert, 0), self.last.get(expert, 0))


class LRFUPolicy(ExpertPolicy):
    def __init__(self, lam: float = LRFU_LAMBDA) -> None:
        super().__init__()
        self.lam = lam
        self.crf: dict[int, tuple[float, int]] = {}  # expert -> (CRF at step `at`, at)

    def value(self, expert: int, step: int) -> float:
        crf, at = self.crf.get(expert, (0.0, step))
        return crf * 2.0 ** (-self.lam * (step - at))

    def used(self, expert: int, step: int) -> None:
        super().used(expert, step)
        self.crf[expert] = (1.0 + self.value(expert, step), step)

    def key(self, expert: int, step: int) -> tuple:
        return (self.value(expert, step), self.last.get(expert, 0))


def make_expert_policy(name: str) -> ExpertPolicy:
    if name == "lru":
        return LRUPolicy()
    if name == "lfu":
        return LFUPolicy()
    if name == "lrfu":
        return LRFUPolicy()
    raise ValueError(f"unknown expert eviction policy {name!r}")

"""The expert cache on a routing trace: strata's own slot planner (strata/moe/slots.py, the
code CachedBank runs) for each policy, with and without prefetch, and Belady's optimal
eviction (offline: it knows the whole trace) on the same trace, as the bound.

Every miss is copied (the CPU setup's rule, and the one Belady is optimal for); a step's
experts that have yet to run are never evicted (waves), for both. Prefetch: before each
MoE layer but the first, the trace's hint for it (the layer before's router) is prefetched.
Bytes are expert copies and prefetches times one expert's bytes.
"""

from __future__ import annotations

from collections import defaultdict

from benchmarks.moe_parts.traces import Trace
from strata.moe.slots import ExpertSlots


def _sums(caches: list[ExpertSlots]) -> tuple[int, int, int, int]:
    c = [x.counters for x in caches]
    return (sum(x.runs for x in c), sum(x.hits for x in c), sum(x.copies + x.prefetches for x in c),
            sum(x.prefetch_wasted for x in c))


def run_policy(trace: Trace, slots: int, policy: str, prefetch: bool, warm: int = 0) -> dict:
    """Counts from step `warm` on (the steps before fill the slots)."""
    layers = len(trace.steps[0])
    caches = [ExpertSlots(slots, policy) for _ in range(layers)]
    start = (0, 0, 0, 0)
    for t, (step, hints) in enumerate(zip(trace.steps, trace.hints)):
        if t == warm:
            start = _sums(caches)
        for n, (routed, hint) in enumerate(zip(step, hints)):
            c = caches[n]
            if prefetch and n > 0:
                c.hint(hint)
            c.begin([e for e, _ in routed])
            for e, rows in routed:
                c.take(e, copy=True, rows=rows)
    runs, hits, copied, wasted = (b - a for a, b in zip(start, _sums(caches)))
    tokens = (len(trace.steps) - warm) * trace.lanes
    return {"hit_ratio": hits / runs, "copies_per_token": copied / tokens,
            "wasted_prefetches_per_token": wasted / tokens}


def run_belady(trace: Trace, slots: int, warm: int = 0) -> dict:
    """Belady's MIN per layer: on a miss with every slot full, evict the resident expert (not
    needed later in this step) whose next use is furthest in the future. Counts from step
    `warm` on."""
    layers = len(trace.steps[0])
    hits = runs = copies = 0
    for n in range(layers):
        seq = [[e for e, _ in step[n]] for step in trace.steps]
        uses: dict[int, list[int]] = defaultdict(list)  # expert -> steps using it, ascending
        for t, experts in enumerate(seq):
            for e in experts:
                uses[e].append(t)
        pos = defaultdict(int)
        resident: set[int] = set()
        for t, experts in enumerate(seq):
            for e in experts:
                pos[e] += 1  # uses[e][pos[e]] is now its next use after this step
            counted = t >= warm
            for i, e in enumerate(experts):
                runs += counted
                if e in resident:
                    hits += counted
                    continue
                if len(resident) >= slots:
                    later = set(experts[i + 1:])
                    options = [r for r in resident if r not in later]
                    if not options:
                        continue  # every slot is needed later this step (or none): run it where it lives

                    def next_use(r: int) -> float:
                        u = uses[r]
                        return u[pos[r]] if pos[r] < len(u) else float("inf")
                    resident.discard(max(options, key=lambda r: (next_use(r), r)))
                resident.add(e)
                copies += counted
    tokens = (len(trace.steps) - warm) * trace.lanes
    return {"hit_ratio": hits / runs, "copies_per_token": copies / tokens, "wasted_prefetches_per_token": 0.0}

"""The device budget across depths: bytes copied to the device per decoded token, for a
fixed split and the adaptive one, on an OLMoE-shaped model (16 layers, 64 experts, top-8,
hidden 2048, expert width 1024, 16 K/V heads of 128; bf16 weights and K/V).

Arms (one lane, `strata generate`'s case):
- fixed, ring = cap: every run's ring is `--kv-resident` (K/V first: "K/V in VRAM, fewer
  cached experts"), the experts get the rest;
- fixed, ring = default: every run's ring is the default ring;
- adaptive: kv/budget_rule.py with the ring rule on (STRATA_KV_RING_ADAPT=1: the rule's ring,
  never more than the run fills; the rest to expert slots);
- adaptive, fill: kv/budget_rule.py with the rule off (the ring the run fills, up to the cap).
Expert bytes come from strata's slot planner on a synthetic trace (zipf+reuse, default
policy); ring bytes from kv/residency.py's plan for a lane reading its whole context every
step (exact attention), the ring holding what it can and the rest streamed. Long contexts
are synthetic: only the bytes are modelled, nothing is computed. Both count decode steps
after a warm-up (the ring's first fill is the prefill's, not a decode step's).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.moe_parts.cache import run_policy
from benchmarks.moe_parts.traces import Trace
from strata.kv.residency import LaneReads, Residency
from strata.kv.ring_rule import RingSizing
from strata.moe.budget import DeviceBudget
from strata.kv.budget_rule import MIB, BudgetShape, ring_ask

GIB = 1 << 30
LAYERS, EXPERTS, TOP_K, HIDDEN, WIDTH, KV_HEADS, HEAD_DIM, VOCAB = 16, 64, 8, 2048, 1024, 16, 128, 50304
EXPERT_BYTES = 3 * HIDDEN * WIDTH * 2  # one expert of one layer, bf16
SLOT_BYTES = LAYERS * EXPERT_BYTES  # one slot in every layer
CELL_BYTES = LAYERS * 2 * KV_HEADS * HEAD_DIM * 2  # K and V, every layer, bf16
RESIDENT_BYTES = LAYERS * (4 * HIDDEN * HIDDEN + HIDDEN * EXPERTS) * 2 + 2 * VOCAB * HIDDEN * 2


@dataclass(frozen=True)
class Setup:
    device_mib: int
    cap: int  # --kv-resident
    default_ring: int
    page: int
    new: int  # decoded tokens a run asks for
    min_slots: int = TOP_K

    def shape(self) -> BudgetShape:
        floor = RingSizing(self.cap, self.page, self.default_ring, adaptive=True).floor_cells
        return BudgetShape(self.device_mib * MIB, RESIDENT_BYTES, SLOT_BYTES, EXPERTS, self.min_slots, CELL_BYTES,
                           1, floor)


def ring_bytes_per_token(depth: int, ring_cells: int, page: int, steps: int, warm: int) -> float:
    res = Residency(max(1, ring_cells // page), "clock")
    copied = 0
    for t in range(warm + steps):
        pages = tuple(range(-(-(depth + t + 1) // page)))
        plan = res.plan([LaneReads(0, ring_cells // page, pages)])
        if t >= warm:
            copied += (len(plan.streamed) + len(plan.admitted)) * page * CELL_BYTES
    return copied / steps


def arm_ring(arm: str, s: Setup, depth: int) -> int:
    if arm == "fixed: ring = cap":
        return RingSizing(s.cap, s.page).cap_cells
    if arm == "fixed: ring = default":
        return RingSizing(s.cap, s.page, s.default_ring, adaptive=True).floor_cells
    return ring_ask(RingSizing(s.cap, s.page, s.default_ring, adaptive=arm == "adaptive"), depth, s.new)


ARMS = ("fixed: ring = cap", "fixed: ring = default", "adaptive", "adaptive, fill")


def run_depths(s: Setup, depths: dict[str, int], trace: Trace, policy: str, warm: int) -> dict:
    """depth tier -> arm -> {ring_cells, expert_slots, MiB per token (experts, ring, total)}."""
    shape = s.shape()
    expert_cache: dict[int, float] = {}
    out = {}
    for tier, depth in depths.items():
        out[tier] = {}
        for arm in ARMS:
            ring = arm_ring(arm, s, depth)
            budget = DeviceBudget(shape) if arm.startswith("adaptive") else None
            if budget is not None:
                budget.admit(0, ring)
                slots = budget.split.expert_slots
            else:
                slots = min(EXPERTS, (shape.avail_bytes - ring * CELL_BYTES) // SLOT_BYTES)
            if slots not in expert_cache:
                r = run_policy(trace, slots, policy, prefetch=False, warm=warm)
                expert_cache[slots] = r["copies_per_token"] * EXPERT_BYTES
            ring_b = ring_bytes_per_token(depth, ring, s.page, len(trace.steps) - warm, warm)
            out[tier][arm] = {"ring_cells": ring, "expert_slots": slots,
                              "expert_mib_per_token": expert_cache[slots] / MIB, "ring_mib_per_token": ring_b / MIB,
                              "mib_per_token": (expert_cache[slots] + ring_b) / MIB}
    return out


def serve_sequence(s: Setup, depths: dict[str, int], lanes: int) -> list[dict]:
    """`strata serve`'s re-split: a shallow request, then a deep one, both finish; the split
    after each event."""
    sizing = RingSizing(s.cap, s.page, s.default_ring, adaptive=True)
    shape = BudgetShape(s.device_mib * MIB, RESIDENT_BYTES, SLOT_BYTES, EXPERTS, s.min_slots, CELL_BYTES, lanes,
                        sizing.floor_cells)
    b = DeviceBudget(shape)
    shallow, deep = min(depths.values()), max(depths.values())
    events = [("start", None, 0), ("admit shallow", 0, shallow), ("admit deep", 1, deep), ("finish deep", 1, None),
              ("finish shallow", 0, None)]
    rows = []
    for name, lane, depth in events:
        if name.startswith("admit"):
            b.admit(lane, ring_ask(sizing, depth, s.new))
        elif name.startswith("finish"):
            b.finish(lane)
        rows.append({"event": name, "expert_slots": b.split.expert_slots,
                     "ring_cells": "+".join(str(c) for _, c in b.split.ring_cells) or "0",
                     "used_gib": b.used_bytes() / GIB})
    return rows

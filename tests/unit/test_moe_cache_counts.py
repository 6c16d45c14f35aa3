"""The expert cache's accounting (moe/slots.py, evict.py, CachedBank.stats): hand-worked
traces, and random traces against a reference simulator written here from the rules
(docs/moe-cache.md), not from the code."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.moe.cache import CachedBank
from strata.moe.evict import EVICT_POLICIES
from strata.moe.slots import ExpertSlots
from tests.unit.test_moe_experts import dense_expert


def simulate(capacity: int, policy: str, steps, lam: float = 0.5) -> dict:
    """The rules, plainly: `steps` is a list of ("hint", experts) and ("run", experts) events.
    A run's missing expert takes a free slot, else evicts the policy's choice among resident
    experts the step no longer needs, else runs on the host; a hint fills free slots or evicts
    (never an expert it names), stopping at the first it cannot place."""
    resident: list[int] = []
    free = capacity
    last: dict[int, int] = {}
    uses: dict[int, int] = {}
    crf: dict[int, tuple[float, int]] = {}
    fresh: set[int] = set()
    clock = step = 0
    n = dict(hits=0, misses=0, host_runs=0, copies=0, evictions=0, prefetches=0, prefetch_hits=0,
             prefetch_wasted=0)

    def tick(e):
        nonlocal clock
        clock += 1
        last[e] = clock

    def worth(e):
        if policy == "lru":
            return (last[e], e)
        if policy == "lfu":
            return (uses[e], last[e], e)
        v, at = crf.get(e, (0.0, step))
        return (v * 2.0 ** (-lam * (step - at)), last[e], e)

    def use(e):
        tick(e)
        if e in uses:
            uses[e] += 1
        v, at = crf.get(e, (0.0, step))
        crf[e] = (1.0 + v * 2.0 ** (-lam * (step - at)), step)

    def room(keep) -> bool:
        nonlocal free
        if free:
            free -= 1
            return True
        options = [e for e in resident if e not in keep]
        if not options:
            return False
        victim = min(options, key=worth)
        resident.remove(victim)
        del uses[victim]
        n["evictions"] += 1
        if victim in fresh:
            fresh.discard(victim)
            n["prefetch_wasted"] += 1
        return True

    def put(e):
        resident.append(e)
        uses[e] = 0
        tick(e)

    for kind, experts in steps:
        if kind == "hint":
            keep = {e for e in experts if e in resident}
            for e in experts:
                if e in resident:
                    continue
                if not room(keep):
                    break
                put(e)
                fresh.add(e)
                keep.add(e)
                n["prefetches"] += 1
            continue
        step += 1
        for i, e in enumerate(experts):
            if e in resident:
                n["hits"] += 1
                if e in fresh:
                    fresh.discard(e)
                    n["prefetch_hits"] += 1
            else:
                n["misses"] += 1
                if room(set(experts[i + 1:])):
                    put(e)
                    n["copies"] += 1
                else:
                    n["host_runs"] += 1
            use(e)
    return n


def drive(capacity: int, policy: str, steps) -> dict:
    slots = ExpertSlots(capacity, policy)
    for kind, experts in steps:
        if kind == "hint":
            slots.hint(experts)
        else:
            slots.begin(experts)
            for e in experts:
                slots.take(e, copy=True)
        slots.check()
    c = vars(slots.counters)
    return {k: c[k] for k in simulate(0, "lru", [])}


def runs(*steps):
    return [("run", list(s)) for s in steps]


def test_lru_by_hand():
    # slots {0,1}; 2 evicts 0 (least recent); 0 evicts 1; 1 evicts 0 (2 is needed later in the
    # step); then 0 finds both slots held by experts its step still needs: it runs on the host.
    steps = runs([0, 1], [2], [0], [1, 2], [0, 1, 2])
    want = dict(hits=3, misses=6, host_runs=1, copies=5, evictions=3)
    got = drive(2, "lru", steps)
    assert {k: got[k] for k in want} == want
    assert simulate(2, "lru", steps) == got


def test_lfu_keeps_the_frequent_one_lru_does_not():
    steps = runs([0], [0], [0], [1], [2], [0])
    assert {k: drive(2, "lru", steps)[k] for k in ("hits", "misses", "evictions")} == dict(hits=2, misses=4, evictions=2)
    assert {k: drive(2, "lfu", steps)[k] for k in ("hits", "misses", "evictions")} == dict(hits=3, misses=3, evictions=1)


def test_prefetch_by_hand():
    # hint 3 -> free slot; [3, 4]: 3 a prefetch hit, 4 copied; hint 5 evicts 3 (least recent);
    # [4] a hit; [3] evicts 5, never used: a wasted prefetch.
    steps = [("hint", [3]), ("run", [3, 4]), ("hint", [5]), ("run", [4]), ("run", [3])]
    want = dict(hits=2, misses=2, host_runs=0, copies=2, evictions=2, prefetches=2, prefetch_hits=1,
                prefetch_wasted=1)
    assert drive(2, "lru", steps) == want == simulate(2, "lru", steps)


def test_more_experts_than_slots_run_in_waves():
    # 1 slot, a step of 3: each expert takes the slot of the one that ran before it.
    got = drive(1, "lru", runs([0, 1, 2]))
    assert (got["copies"], got["evictions"], got["host_runs"]) == (3, 2, 0)


events = st.lists(st.tuples(st.sampled_from(["run", "run", "hint"]),
                            st.lists(st.integers(0, 7), min_size=1, max_size=5, unique=True)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(0, 8), policy=st.sampled_from(EVICT_POLICIES), steps=events)
def test_counts_match_the_reference_simulator(capacity, policy, steps):
    assert drive(capacity, policy, steps) == simulate(capacity, policy, steps)


def test_bank_counts_bytes_per_layer_and_per_token():
    gen = torch.Generator().manual_seed(4)
    layers = [[dense_expert(gen, 8, 4) for _ in range(4)], [dense_expert(gen, 8, 2) for _ in range(4)]]
    bank = CachedBank(layers, 2, "cpu", "lru", 2, prefetch=True)
    x = torch.zeros(1, 8)
    for step in ([0, 1], [2, 3], [0, 1]):
        bank.plan(0, step)
        for e in step:
            bank.run(0, e, x)
        bank.hint(1, step)  # the next layer's router names the same experts
        bank.plan(1, step)
        for e in step:
            bank.run(1, e, x)
    s = bank.stats()
    b0, b1 = layers[0][0].num_bytes, layers[1][0].num_bytes
    # layer 0: 6 copies (every step misses with 2 slots); layer 1: 6 prefetches, 6 prefetch hits
    assert [(x["hits"], x["misses"], x["bytes_copied"]) for x in s["layers"]] == [(0, 6, 6 * b0), (6, 0, 6 * b1)]
    assert s["prefetch_hits"] == 6 and s["evictions"] == 4 + 4
    # tokens: 2 rows a step at the first MoE layer, 2 experts per token: 3 tokens
    assert s["tokens"] == 3 and s["bytes_copied"] == 6 * (b0 + b1) and s["bytes_copied_per_token"] == 2 * (b0 + b1)
    assert s["hit_ratio"] == 0.5

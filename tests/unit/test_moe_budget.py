"""The device budget (kv/budget_rule.py, budget.py): the split rule on a worked example, the
generate sizing, and, through random admissions and finishes with a real CachedBank resized
to each split, that slots x expert bytes + ring cells x bytes per cell never exceed it; the
flags validated by name (moe/options.py)."""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.errors import ConfigError
from strata.kv.ring_rule import RingSizing
from strata.moe.budget import DeviceBudget
from strata.kv.budget_rule import MIB, BudgetShape, expert_slots, grant, ring_ask
from strata.moe.cache import CachedBank
from strata.moe.options import MoEOptions
from tests.unit.test_moe_experts import dense_expert

# avail = 828 - 100 = 728; reserve = 2 slots x 100 + 2 lanes x 64 cells x 1 = 328; free = 400
SHAPE = BudgetShape(device_bytes=828, resident_bytes=100, slot_bytes=100, max_slots=8, min_slots=2,
                    cell_bytes=1, num_lanes=2, floor_cells=64)


def test_split_by_hand(caplog):
    caplog.set_level(logging.INFO, logger="strata.budget")
    b = DeviceBudget(SHAPE)
    assert b.split.expert_slots == 7  # 728 // 100: idle lanes' floors go to experts
    assert b.admit(0, 32) and b.ring_cells(0) == 32 and b.split.expert_slots == 6  # (728 - 32) // 100
    assert b.admit(1, 256) and b.ring_cells(1) == 256 and b.split.expert_slots == 4  # 192 above the floor fit in 400
    assert b.finish(0) and b.split.expert_slots == 4 and b.split.ring_bytes == 256  # (728 - 256) // 100
    assert b.admit(0, 512) and b.ring_cells(0) == 64 and b.counters.fallbacks == 1  # 448 + 192 > 400: the floor
    assert b.split.expert_slots == 4  # (728 - 320) // 100
    assert b.finish(1) and b.split.expert_slots == 6  # the deep request gives its ring back
    assert b.finish(0) and b.split.expert_slots == 7
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("device budget:")]
    assert len(lines) == 1 + b.counters.changes
    assert lines[0].startswith("device budget: 7 expert slots per layer")


def test_finish_that_changes_only_the_rings_says_so():
    b = DeviceBudget(SHAPE)
    b.admit(0, 32)
    b.admit(1, 256)
    assert b.finish(0) is True  # ring bytes 288 -> 256: a change (logged), slots unchanged
    assert b.split.expert_slots == 4


def test_grant_and_slots_are_pure():
    assert grant(SHAPE, {}, 40) == 40
    assert grant(SHAPE, {}, 64 + 400) == 464 and grant(SHAPE, {}, 64 + 401) == 64
    assert grant(SHAPE, {3: 64 + 300}, 64 + 100) == 164 and grant(SHAPE, {3: 64 + 300}, 64 + 101) == 64
    assert expert_slots(SHAPE, {0: 464, 1: 64}) == 2  # (728 - 528) // 100: never below min
    assert expert_slots(BudgetShape(10**6, 0, 100, 8, 1), {}) == 8  # capped at --moe-resident


def test_generate_sizes_the_ring_by_the_rule_and_gives_the_rest_to_experts():
    sizing = RingSizing(cap=256, page=16, default_ring=64, adaptive=True)
    assert ring_ask(sizing, 10, 10) == 32  # the rule's 64, but the run fills 32
    assert ring_ask(sizing, 100, 20) == 64  # needed 144 < cap: the default ring
    assert ring_ask(sizing, 300, 20) == 256  # needed 336 >= cap: the cap
    shape = BudgetShape(device_bytes=1000, resident_bytes=0, slot_bytes=100, max_slots=16, min_slots=1,
                        cell_bytes=2, num_lanes=1, floor_cells=64)
    for prompt, slots in ((10, 9), (100, 8), (300, 4)):  # (1000 - 2 * ring) // 100
        b = DeviceBudget(shape)
        b.admit(0, ring_ask(sizing, prompt, 20 if prompt > 10 else 10))
        assert b.split.expert_slots == slots


def test_a_budget_too_small_names_the_flag():
    with pytest.raises(ConfigError, match=r"--device-memory 0 MiB .* needs at least 1 MiB"):
        BudgetShape(device_bytes=427, resident_bytes=100, slot_bytes=100, max_slots=8, min_slots=2,
                    cell_bytes=1, num_lanes=2, floor_cells=64)
    with pytest.raises(ConfigError, match=r"--device-memory 100 MiB .* needs at least 101 MiB"):
        BudgetShape(device_bytes=100 * MIB, resident_bytes=100 * MIB, slot_bytes=MIB, max_slots=8, min_slots=1)


@pytest.fixture(scope="module")
def tiny_layers():
    gen = torch.Generator().manual_seed(7)
    return [[dense_expert(gen, 8, 4) for _ in range(8)], [], [dense_expert(gen, 8, 6) for _ in range(8)]]


def _buffer_bytes(bank: CachedBank) -> int:
    return sum(t.numel() * t.element_size() for layer in bank.buffers for e in layer for t in e.tensors())


@settings(max_examples=100, deadline=None)
@given(lanes=st.integers(1, 4), min_slots=st.integers(0, 3), extra=st.integers(0, 3000),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(1, 2048)), max_size=25))
def test_the_budget_holds_through_admissions_and_finishes(tiny_layers, lanes, min_slots, extra, ops):
    slot = sum(layer[0].num_bytes for layer in tiny_layers if layer)  # one slot in every MoE layer
    cell, floor = 3, 128
    shape = BudgetShape(device_bytes=500 + min_slots * slot + lanes * floor * cell + extra, resident_bytes=500,
                        slot_bytes=slot, max_slots=8, min_slots=min_slots, cell_bytes=cell, num_lanes=lanes,
                        floor_cells=floor)
    b = DeviceBudget(shape)
    bank = CachedBank(tiny_layers, b.split.expert_slots, "cpu", "lru", 2)
    first = b.split.expert_slots
    for admit, lane, ask in ops:
        lane %= lanes
        before = b.split.expert_slots
        if admit and lane not in b.held:
            b.admit(lane, ask)
            got = b.ring_cells(lane)
            assert got == ask or (ask > floor and got == floor)
            assert b.split.expert_slots <= before
        elif not admit:
            b.finish(lane)
            assert b.split.expert_slots >= before
        bank.resize(b.split.expert_slots)
        rings = sum(b.held.values()) * cell
        assert _buffer_bytes(bank) == b.split.expert_slots * slot
        assert shape.resident_bytes + _buffer_bytes(bank) + rings <= shape.device_bytes
        assert min_slots <= b.split.expert_slots <= 8
    for lane in list(b.held):
        b.finish(lane)
    assert b.split.expert_slots == first


def test_flags_are_validated_by_name():
    cases = [
        (dict(resident=0), "--moe-resident must be at least 1"),
        (dict(resident="4"), "--moe-resident must be an integer"),
        (dict(evict="fifo"), "--moe-evict must be one of lru, lfu, lrfu"),
        (dict(device_memory_mib=0), "--device-memory must be at least 1"),
        (dict(device_memory_mib=True), "--device-memory must be an integer"),
        (dict(resident_min=2), "--moe-resident-min needs --device-memory"),
        (dict(resident_min=-1, device_memory_mib=10), "--moe-resident-min must be at least 0"),
        (dict(resident=2, resident_min=3, device_memory_mib=10), "--moe-resident-min 3 is above --moe-resident 2"),
        (dict(prefetch="yes"), "--moe-prefetch is on or off"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            MoEOptions(**kwargs)
    with pytest.raises(ConfigError, match="--moe-resident 9 is above the model's 8 experts"):
        MoEOptions(resident=9).check_model(8, 2)
    with pytest.raises(ConfigError, match="--moe-resident is for mixture-of-experts models"):
        MoEOptions(resident=2).check_model(0, 0)
    o = MoEOptions(resident=4, device_memory_mib=100)
    assert o.cached and o.min_slots(8, 2) == 2 and o.max_slots(8) == 4
    assert MoEOptions(resident=1).min_slots(8, 2) == 1 and not MoEOptions().cached

"""The expert cache (moe/cache.py, slots.py, evict.py) is invisible and counted exactly.

- As a hypothesis property over random tiny experts (dense float32 and quantized), random
  routing, every capacity from top-k to all experts (and below top-k: waves and host runs),
  each policy, with and without prefetch, with copy-every-miss and a cost model that runs
  small steps on the host, and budget re-splits between steps: every CachedBank.run result
  `torch.equal`s the ResidentBank's.
- On hand-worked traces, and on random ones against a reference simulator written here,
  hits, misses, evictions, host runs, prefetches and bytes copied are what they must be
  (tests/unit/test_moe_cache_counts.py).
`STRATA_TEST_DEVICES=cuda` puts the dense property's slots on that device (benchmarks/moe_cuda.sh):
slot runs are compared with `torch.equal` against resident experts on the same device, host
runs (the CPU's kernels) with a float32 tolerance.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.models.expert_bank import ResidentBank
from strata.moe.cache import CachedBank, expert_params
from strata.moe.cost import CostModel
from strata.moe.evict import EVICT_POLICIES
from tests.unit.test_moe_experts import dense_expert, quant_expert

DEVICE = os.environ.get("STRATA_TEST_DEVICES", "cpu")
HIDDEN, WIDTH = 32, 32
NUM_EXPERTS = 6


def _small_rows_cost(e) -> CostModel:
    """A cost model under which runs of 1 or 2 rows are cheaper on the host, 3 or more copied."""
    # copy_s = B / link; host_s = 2 * P * r / flops (+ tiny rows term): copy when r >= B / (2 P)
    b, p = e.num_bytes, expert_params(e)
    return CostModel(link_bytes_per_s=1.0, host_bytes_per_s=1e30, host_flops_per_s=2.0 * p * 2.5 / b)


@pytest.fixture(scope="module")
def dense_layers():
    gen = torch.Generator().manual_seed(0)
    return [[dense_expert(gen, HIDDEN, WIDTH) for _ in range(NUM_EXPERTS)], [],
            [dense_expert(gen, HIDDEN, WIDTH) for _ in range(NUM_EXPERTS)]]


@pytest.fixture(scope="module")
def quant_layers(quant_ops):
    rng = np.random.default_rng(1)
    return [[quant_expert(rng, 64, 32) for _ in range(NUM_EXPERTS)]]


def steps_strategy(num_layers: int):
    """Per step and MoE layer: rows routed to each of the step's distinct experts (run order),
    and a hint for the layer (the next layer's likely experts, as a router would name them)."""
    layer_step = st.tuples(
        st.lists(st.tuples(st.integers(0, NUM_EXPERTS - 1), st.integers(1, 4)), min_size=1, max_size=NUM_EXPERTS,
                 unique_by=lambda t: t[0]),
        st.lists(st.integers(0, NUM_EXPERTS - 1), max_size=3, unique=True))
    return st.lists(st.tuples(st.lists(layer_step, min_size=num_layers, max_size=num_layers),
                              st.none() | st.integers(0, NUM_EXPERTS)), min_size=1, max_size=8)


def on_device(layers, device: str):
    def moved(e):
        d = e.empty_like(device)
        d.copy_from(e)
        return d
    return layers if device == "cpu" else [[moved(e) for e in layer] for layer in layers]


def check_invisible(layers, hidden, capacity, policy, prefetch, cost, steps, seed, device="cpu"):
    moe = [n for n, layer in enumerate(layers) if layer]
    bank = CachedBank(layers, capacity, device, policy, 1, prefetch=prefetch, cost=cost)
    ref = ResidentBank(on_device(layers, device))
    gen = torch.Generator().manual_seed(seed)
    for per_layer, resize in steps:
        for n, (routed, hint) in zip(moe, per_layer):
            bank.hint(n, hint)
            experts = [e for e, _ in routed]
            bank.plan(n, experts)
            ref.plan(n, experts)
            for e, rows in routed:
                x = torch.randn(rows, hidden, generator=gen).to(device)
                host_runs = bank.layer_counters(n).host_runs
                y, want = bank.run(n, e, x), ref.run(n, e, x)
                if device != "cpu" and bank.layer_counters(n).host_runs > host_runs:
                    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
                else:
                    assert torch.equal(y, want)
            bank.slots[n].check()
        if resize is not None:
            bank.resize(resize)
            assert all(len(bank.buffers[n]) == bank.slots[n].num_slots == min(resize, NUM_EXPERTS) for n in moe)
    s = bank.stats()
    assert s["hits"] + s["misses"] == s["runs"] == sum(len(r) for step, _ in steps for r, _ in step)
    if cost is None:
        assert s["host_runs"] <= s["runs"]
    return s


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capacity=st.integers(0, NUM_EXPERTS), policy=st.sampled_from(EVICT_POLICIES), prefetch=st.booleans(),
       host_small=st.booleans(), steps=steps_strategy(2), seed=st.integers(0, 2**16))
def test_cache_is_invisible_dense(dense_layers, capacity, policy, prefetch, host_small, steps, seed):
    cost = _small_rows_cost(dense_layers[0][0]) if host_small else None
    check_invisible(dense_layers, HIDDEN, capacity, policy, prefetch, cost, steps, seed, DEVICE)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(capacity=st.integers(1, NUM_EXPERTS), policy=st.sampled_from(EVICT_POLICIES), prefetch=st.booleans(),
       steps=steps_strategy(1), seed=st.integers(0, 2**16))
def test_cache_is_invisible_quantized(quant_layers, capacity, policy, prefetch, steps, seed):
    check_invisible(quant_layers, 64, capacity, policy, prefetch, None, steps, seed)


def test_cost_model_sends_small_steps_to_the_host(dense_layers):
    cost = _small_rows_cost(dense_layers[0][0])
    e = dense_layers[0][0]
    b, p = e.num_bytes, expert_params(e)
    assert [cost.copies(b, p, r, HIDDEN * 4) for r in (1, 2, 3, 8)] == [False, False, True, True]
    bank = CachedBank(dense_layers, 2, "cpu", "lru", 1, cost=cost)
    for n, rows in ((0, 1), (1, 3), (0, 8), (1, 1)):
        bank.plan(0, [n])
        bank.run(0, n, torch.zeros(rows, HIDDEN))
    c = bank.layer_counters(0)
    # 0 x1: host; 1 x3: copied; 0 x8: copied; 1 x1: a hit (resident already)
    assert (c.host_runs, c.copies, c.hits, c.misses) == (1, 2, 1, 3)
    assert bank.bytes_copied(0) == 2 * e.num_bytes
    assert CostModel.for_device("cpu") is None and CostModel.for_device("cuda") is not None


def test_slots_are_their_own_buffers(dense_layers):
    bank = CachedBank(dense_layers, 2, "cpu", "lru", 1)
    host = {t.data_ptr() for layer in dense_layers for e in layer for t in e.tensors()}
    slots = {t.data_ptr() for layer in bank.buffers for e in layer for t in e.tensors()}
    assert len(slots) == 2 * 2 * 2 and not host & slots
    assert bank.stats()["slot_bytes"] == 2 * 2 * dense_layers[0][0].num_bytes


def test_a_layer_of_mixed_layouts_is_refused():
    gen = torch.Generator().manual_seed(5)
    with pytest.raises(ValueError, match="same storage layout"):
        CachedBank([[dense_expert(gen, 8, 4), dense_expert(gen, 8, 6)]], 1, "cpu", "lru", 1)


def test_a_failed_step_leaves_the_cache_exact(dense_layers, monkeypatch):
    """A copy that fails part way leaves its slot empty; the next step begins afresh."""
    bank = CachedBank(dense_layers, 1, "cpu", "lru", 1)
    ref = ResidentBank(dense_layers)
    x = torch.randn(2, HIDDEN)
    bank.plan(0, [0, 1])
    bank.run(0, 0, x)  # 1 never runs: the step failed after it
    slot = bank.buffers[0][0]
    real = type(slot).copy_from

    def broken(self, src, non_blocking=False):
        self.tensors()[0].zero_()
        raise RuntimeError("copy failed")
    monkeypatch.setattr(type(slot), "copy_from", broken)
    bank.plan(0, [1])
    with pytest.raises(RuntimeError, match="copy failed"):
        bank.run(0, 1, x)
    assert bank.slots[0].slot_of == {}
    monkeypatch.setattr(type(slot), "copy_from", real)
    for e in (1, 0):
        bank.plan(0, [e])
        assert torch.equal(bank.run(0, e, x), ref.run(0, e, x))
    bank.slots[0].check()

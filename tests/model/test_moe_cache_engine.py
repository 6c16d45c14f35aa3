"""The expert cache is invisible end to end: a tiny MoE model (Qwen2-MoE: shared expert, a
dense layer between MoE layers; OLMoE) decodes the same greedy tokens, and its prompt logits
are `torch.equal`, for every capacity from 1 (below top-k: waves) to all experts, each
policy, with and without prefetch, with one lane and several, with n-gram drafts or none,
with and without the ring; and with `--device-memory` the budget holds while requests are
admitted and finish (float32). `STRATA_TEST_DEVICES=cuda` (benchmarks/moe_cuda.sh) puts the
engines on that device; there the flag-built caches run decode misses on the host (the cost
model), whose CPU kernels round differently, so their logits are compared with a tolerance."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.moe.budget import DeviceBudget
from strata.moe.cache import CachedBank
from strata.moe.evict import EVICT_POLICIES
from strata.sampling import SamplingParams
from strata.testing import prompt_logits
from tests.conftest import require
from tests.model.engine_runs import run_requests
from tests.model.test_moe_gguf import case as gguf_case  # noqa: F401  (a fixture: each family's GGUF file)
from tests.model.test_moe_gguf import fields  # noqa: F401  (the fixture it takes)
from tests.model.test_moe_parity import tiny_moe_dir

require("transformers")

NEW = 10
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
CASES = ("qwen2_moe", "olmoe")
DEVICE = os.environ.get("STRATA_TEST_DEVICES", "cpu")
BASE = dict(dtype="float32", max_context=192, kv_chunk=16, prefill_chunk=11, devices=(DEVICE,))


@pytest.fixture(scope="module")
def engines(tmp_path_factory, smol_tokenizer):
    paths = {c: tiny_moe_dir(c, tmp_path_factory, smol_tokenizer) for c in CASES}
    made: dict[tuple, Engine] = {}

    def get(case: str, **options) -> Engine:
        key = (case, tuple(sorted(options.items())))
        if key not in made:
            made[key] = Engine(EngineConfig(model=paths[case], **{**BASE, **options}), progress=False)
        e = made[key]
        e._scheduler.clear_cache()
        return e
    return get


prompts_st = st.lists(st.integers(3, 40000), min_size=1, max_size=40)
REFERENCE: dict[tuple, list[int]] = {}


def reference_tokens(engines, case: str, prompt: list[int]) -> list[int]:
    """The all-resident engine's greedy tokens (one lane, no ring, no drafts)."""
    key = (case, tuple(prompt))
    if key not in REFERENCE:
        REFERENCE[key] = run_requests(engines(case, spec="off"), [prompt], GREEDY)[0]
    return REFERENCE[key]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(CASES), capacity=st.integers(1, 8), policy=st.sampled_from(EVICT_POLICIES),
       prefetch=st.booleans(), batch=st.sampled_from([0, 2]), spec=st.sampled_from(["ngram", "off"]),
       ring=st.booleans(), prompts=st.lists(prompts_st, min_size=1, max_size=3))
def test_greedy_tokens_are_the_all_resident_ones(engines, case, capacity, policy, prefetch, batch, spec, ring,
                                                 prompts):
    layout = dict(batch=batch, spec=spec, **(dict(kv_resident=32, kv_page=16) if ring else {}))
    cached = engines(case, moe_resident=8, **layout)  # one engine per layout; a fresh cache per example
    model = cached._model
    assert isinstance(model.bank, CachedBank)
    bank = model.bank = CachedBank(model.experts, capacity, DEVICE, policy, model.cfg.experts_per_token,
                                   prefetch=prefetch, ops=model.ops)
    before = 0
    assert run_requests(cached, prompts, GREEDY) == [reference_tokens(engines, case, p) for p in prompts]
    s = cached.snapshot().moe
    assert s["runs"] > before and s["hits"] + s["misses"] == s["runs"]
    if capacity < 8:
        assert s["misses"] > 0


@pytest.mark.parametrize("case", CASES)
def test_prompt_logits_are_equal(engines, case, smol_tokenizer):
    ids = smol_tokenizer.encode("The expert cache must be invisible: the same logits, bit for bit.")
    want = prompt_logits(engines(case), ids)
    for capacity, prefetch in ((1, False), (2, True), (5, True), (8, False)):
        got = prompt_logits(engines(case, moe_resident=capacity, moe_prefetch=prefetch), ids)
        if DEVICE == "cpu":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_prefetch_is_fed_by_the_next_router(engines, smol_tokenizer):
    e = engines("olmoe", moe_resident=3, moe_prefetch=True)
    run_requests(e, [smol_tokenizer.encode("Prefetch asks the next layer's router.")], GREEDY)
    s = e.snapshot().moe
    assert s["prefetches"] > 0 and s["prefetch_hits"] > 0
    assert s["layers"][0]["layer"] == 0 and s["tokens"] > 0


def test_the_device_budget_holds_through_admissions_and_finishes(engines, smol_tokenizer):
    """Two lanes, a ring and a tight budget: a deep request takes ring from the expert slots and
    gives them back when it ends (at the next step); the tokens stay the all-resident ones.
    The flag is in MiB, too coarse for a tiny model: the engine's budget is replaced by one of
    the same shape sized in bytes (8 slots per layer idle, fewer beside a deep ring)."""
    ring = dict(kv_resident=512, kv_page=16, kv_ring_default=16, kv_ring_adapt=False, max_context=512)
    e = engines("qwen2_moe", batch=1, device_memory=1024, moe_resident_min=2, **ring)
    bank, kv_ring = e._model.bank, e._ring
    slot = bank.budget.shape.slot_bytes
    cell = e._kv.bytes_per_cell
    assert slot == sum(layer[0].num_bytes for layer in e._model.experts if layer)
    shape = dataclasses.replace(bank.budget.shape, device_bytes=bank.budget.shape.resident_bytes + 10 * slot
                                + 2 * 16 * cell)
    budget = bank.budget = DeviceBudget(shape)
    kv_ring.attach_budget(budget, lambda split: bank.resize(split.expert_slots))
    bank.resize(budget.split.expert_slots)
    deep = smol_tokenizer.encode("word " * 400)
    shallow = smol_tokenizer.encode("Hi")
    reference = engines("qwen2_moe", batch=1, max_context=512)
    seen = []

    def after(engine):
        s = budget.split
        rings = sum(c for _, c in s.ring_cells)
        assert shape.resident_bytes + bank.num_slots * slot + rings * cell <= shape.device_bytes
        assert kv_ring.budget_cells == max(16, rings) and bank.num_slots == s.expert_slots >= 2
        seen.append(s.expert_slots)

    assert budget.split.expert_slots == 8  # idle: every expert (10 would fit)
    assert run_requests(e, [deep, shallow], GREEDY, after) == run_requests(reference, [deep, shallow], GREEDY)
    rings = -(-(len(deep) + NEW) // 16) * 16 + -(-(len(shallow) + NEW) // 16) * 16  # what each run fills
    assert min(seen) == (shape.avail_bytes - rings * cell) // slot < 8 and budget.counters.fallbacks == 0
    assert run_requests(e, [shallow], GREEDY, after) == run_requests(reference, [shallow], GREEDY)
    assert seen[-1] == 8 and budget.counters.finishes >= 2  # the deep ring went back
    assert e.snapshot().moe["budget"]["expert_slots"] == 8


@pytest.mark.parametrize("weights", ["native", "auto"])
def test_quantized_gguf_experts_through_the_cache(gguf_case, weights, quant_ops):
    """Stacked quantized experts of a GGUF file (each expert a view of its layer's blocks, read
    in place) copied into slots: the same prompt logits, bit for bit, and greedy tokens."""
    from tests.model.test_moe_gguf import PROMPT, greedy

    def make(**options) -> Engine:
        return Engine(EngineConfig(model=gguf_case.path, dtype="float32", weights=weights, max_context=256,
                                   kv_chunk=16, prefill_chunk=7, devices=(DEVICE,), **options), progress=False)
    plain = make()
    ids = plain.tokenizer.encode(PROMPT)
    want, tokens = prompt_logits(plain, ids), greedy(plain, ids, 12)
    for capacity, prefetch in ((1, True), (3, False)):
        cached = make(moe_resident=capacity, moe_prefetch=prefetch)
        assert isinstance(cached._model.bank, CachedBank)
        got = prompt_logits(cached, ids)
        assert torch.equal(got, want) if DEVICE == "cpu" else torch.allclose(got, want, rtol=1e-4, atol=1e-4)
        assert greedy(cached, ids, 12) == tokens
        assert cached.snapshot().moe["misses"] > 0

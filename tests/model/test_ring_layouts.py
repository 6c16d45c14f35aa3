"""Greedy output through the resident ring equals output without one (a property).

Rings of 1, 2 and 3 pages of 16 cells (conversations here reach ~100 cells: 7 pages, so
most pages stream) and a ring that holds everything, under both residency policies, in
both layouts, with float32 and int8 K/V, a cpu,cpu layer split, across a lane move, a
park and a follow-up, and a branch. The reference is the same engine without a ring.
`STRATA_TEST_DEVICES=cuda` runs the ring's engines on that device (benchmarks/ring_cuda.sh).

Also: the pool (host) copy is complete after a park, a move and ring evictions: every
cell of a conversation the ring streamed or evicted is in the pool, as the no-ring
engine wrote it.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.models.cell_reads import DecodeSpans
from strata.sampling import SamplingParams
from tests.conftest import FUSED_ONLY
from tests.model.engine_runs import move_or_park, run_requests

MAX_CONTEXT = 160
PAGE = 16
NEW = 8
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
DEVICE = os.environ.get("STRATA_TEST_DEVICES", "cpu")

# (pooled, chunk, split, kv, ring pages (None: no ring; 0: one that holds everything), policy)
RINGS = [
    (pooled, chunk, False, "f32", pages, policy)
    for pooled in (False, True)
    for chunk in (16, 64)
    for pages in (0, 1, 2, 3)
    for policy in ("clock", "lrfu")
] + [(True, 16, True, "f32", 2, "clock"), (False, 64, True, "f32", 1, "lrfu"),
     (True, 16, False, "int8", 1, "clock"), (False, 64, False, "int8", 3, "lrfu"), (True, 64, True, "int8", 0, "lrfu")]

prompts_st = st.lists(st.integers(3, 40000), min_size=1, max_size=70)


@pytest.fixture(scope="module")
def engines(tiny_llama_dir):
    @functools.cache
    def get(pooled: bool, chunk: int, split: bool, kv: str, pages: int | None, policy: str = "clock",
            batch: int = 2) -> Engine:
        per_lane = -(-MAX_CONTEXT // chunk) + 1
        pool = {"kv_pool_tokens": (batch + 1) * per_lane * chunk} if pooled else {}
        devices = (DEVICE, DEVICE) if split else (DEVICE,)
        ring = {}
        if pages is not None:
            ring = {"kv_resident": pages * PAGE if pages else MAX_CONTEXT, "kv_page": PAGE, "kv_evict": policy,
                    "kv_ring_adapt": False}
        cfg = EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=MAX_CONTEXT, kv_chunk=chunk,
                           batch=batch, prefill_chunk=13, devices=devices if ring else ("cpu",) * len(devices),
                           kv=kv, **pool, **ring)
        return Engine(cfg, progress=False)

    return get


def run(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    return run_requests(engine, prompts, GREEDY, lambda e: e._ring is not None and e._ring.check())


def reference(engines, prompt: list[int], kv: str) -> list[int]:
    engine = engines(False, 64, False, kv, None)
    engine._scheduler.clear_cache()
    return run(engine, [prompt])[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompts=st.lists(prompts_st, min_size=1, max_size=3), ring=st.sampled_from(RINGS))
def test_batched_through_the_ring_equals_no_ring(engines, prompts, ring):
    engine = engines(*ring)
    engine._scheduler.clear_cache()
    assert run(engine, prompts) == [reference(engines, p, ring[3]) for p in prompts]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=prompts_st, follow=st.lists(st.integers(3, 40000), min_size=1, max_size=20),
       ring=st.sampled_from(RINGS), action=st.sampled_from(["stay", "move", "park", "branch"]))
def test_follow_up_through_the_ring_equals_cold(engines, first, follow, ring, action):
    engine = engines(*ring)
    engine._scheduler.clear_cache()
    (out,) = run(engine, [first])
    prompt = first + out + follow
    move_or_park(engine, action)
    if action == "branch":
        prompt = first[: max(1, len(first) // 2)] + follow
    assert run(engine, [prompt])[0] == reference(engines, prompt, ring[3])


def _cells(engine: Engine, layer: int, lane: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pool's K and V of lane `lane`'s conversation in `layer`, positions in order."""
    conv = engine._scheduler.lanes[lane].conv
    c = engine._kv.chunk_size
    index = torch.tensor([conv.table.chunk_ids[p // c] * c + p % c for p in range(conv.num_cells)])
    k, v = engine._kv.k[layer].data, engine._kv.v[layer].data
    return k[:, index].float(), v[:, index].float()


@pytest.mark.parametrize("pooled", [False, True])
def test_the_pool_copy_is_complete_after_park_move_and_evictions(engines, pooled):
    """A ring of one page, two conversations taking turns (each evicts the other's pages),
    then a move and a park: the pool holds every cell as the no-ring engine wrote it (the
    same values up to float32 rounding of the run-by-run attention), and no cell is left
    unwritten (zeros)."""
    ringed, plain = engines(pooled, 16, False, "f32", 1), engines(pooled, 16, False, "f32", None)
    a, b = list(range(100, 160)), list(range(300, 341))
    for engine in (ringed, plain):
        engine._scheduler.clear_cache()
        run(engine, [a, b])
        lanes = [ln.index for ln in engine._scheduler.lanes if ln.conv is not None]
        engine.move(lanes[0], 2)
        engine.park(lanes[1])
    stats = ringed._ring.stats()
    assert stats["pages_streamed"] > 0 and ringed._ring.counters.pages_admitted >= 2
    for layer in range(ringed._kv.num_layers):
        k1, v1 = _cells(ringed, layer, 2)
        k2, v2 = _cells(plain, layer, 2)
        assert k1.shape[1] == len(a) + NEW - 1
        assert (k1.abs().sum(-1) > 0).all() and (v1.abs().sum(-1) > 0).all()
        torch.testing.assert_close(k1, k2, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v1, v2, rtol=1e-4, atol=1e-5)


def _committed_cells(engine: Engine) -> dict[int, int]:
    """Pool page -> how many of its leading cells hold a position of a held conversation."""
    chunk = engine._kv.chunk_size
    per_chunk = chunk // PAGE
    cells: dict[int, int] = {}
    for conv in engine._scheduler.cache:
        for c, chunk_id in enumerate(conv.table.chunk_ids):
            for i in range(per_chunk):
                n = min(PAGE, max(0, conv.num_cells - c * chunk - i * PAGE))
                page = chunk_id * per_chunk + i
                cells[page] = max(cells.get(page, 0), n)
    return cells


def test_resident_pages_match_the_pool_exactly(engines):
    """Every page the arena holds is a copy of its pool cells, bit for bit (write-through),
    in every cell that holds a position: a page is copied in with its committed cells only,
    the rest are written through the ring before anything reads them."""
    engine = engines(True, 16, False, "f32", 3, "lrfu", batch=3)  # its own: no other test's pages resident
    engine._scheduler.clear_cache()
    run(engine, [list(range(500, 590)), list(range(700, 733))])
    ring = engine._ring.full
    committed = _committed_cells(engine)  # pages no held conversation has: no cell to compare
    assert ring.residency.num_resident > 0
    assert any(0 < committed.get(p, 0) < PAGE for p in ring.residency.slot_of)  # a partial page is resident
    for page, slot in ring.residency.slot_of.items():
        n = committed.get(page, 0)
        for layer in range(engine._kv.num_layers):
            host = engine._kv.k[layer].data[:, page * PAGE : page * PAGE + n]
            dev = ring.arena_k[layer].data[:, slot * PAGE : slot * PAGE + n]
            assert torch.equal(host, dev.cpu())


@pytest.mark.parametrize("pooled", [False, True])
def test_a_streamed_tail_page_copies_its_committed_cells_only(engines, pooled):
    """A ring of 3 pages and a 50-cell prompt: pages 0-2 are resident, the tail page (cells
    48-49, then one more a step) streams. Each decode step copies the tail's committed cells
    (2, 3, ... 8 of them: the new cell is written, not copied), never the whole page."""
    engine = engines(pooled, 16, False, "f32", 3, batch=3)  # its own: no other test's pages resident
    engine._scheduler.clear_cache()
    ring = engine._ring.full
    engine.submit(list(range(900, 950)), GREEDY)
    while not ring.counters.tokens or ring.counters.tokens < 50:  # the prompt, in pieces
        engine.step()
    before = ring.counters.bytes_copied
    while engine.has_work:
        engine.step()
    assert ring.counters.tokens == 50 + NEW - 1
    assert ring.counters.bytes_copied - before == sum(range(2, 2 + NEW - 1)) * ring.bytes_per_cell


def test_default_model_long_prompt_through_a_small_ring(gguf_path):
    """The real model in float32: a ~700-token prompt through a ring of 4 pages of 64 equals no ring."""
    prompt = ("The quick brown fox jumps over the lazy dog. " * 70).strip()
    out = {}
    for ring in ({}, {"kv_resident": 256, "kv_page": 64, "kv_ring_adapt": False}):
        engine = Engine(EngineConfig(model=gguf_path, dtype="float32", max_context=1024, kv_chunk=256,
                                     devices=(DEVICE,) if ring else ("cpu",), **ring), progress=False)
        engine.submit(prompt, SamplingParams(temperature=0, max_tokens=12))
        out[bool(ring)] = [t for o in engine.run_until_done() for t in o.new_token_ids]
        if ring:
            assert engine._ring.stats()["pages_streamed"] > 0
    assert out[True] == out[False] and len(out[True]) > 0


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
@pytest.mark.parametrize("pooled", [False, True])
def test_streamed_pages_are_read_by_the_fused_kernel_beside_resident_ones(engines, monkeypatch, decode_path,
                                                                          decode_ops, pooled):
    """A ring of one page, a conversation of ~60 cells: its decode rows read the resident page
    and the streamed ones in one fused call (the arena, then staging as the second storage),
    and the greedy tokens are the no-ring engine's."""
    if DEVICE != "cpu":
        pytest.skip("the fused decode attention is CPU-only")
    seen = []
    attend = DecodeSpans.attend

    def spy(self, q, k_cache, v_cache):
        parts = k_cache.kernel_reads(q.dtype)
        split = parts[0].shape[1]
        seen.append((len(parts), bool((self.spans[:, 0] < split).any()), bool((self.spans[:, 0] >= split).any())))
        return attend(self, q, k_cache, v_cache)

    monkeypatch.setattr(DecodeSpans, "attend", spy)
    engine = engines(pooled, 16, False, "f32", 1)
    engine._scheduler.clear_cache()
    prompt = list(range(200, 255))
    assert run(engine, [prompt])[0] == reference(engines, prompt, "f32")
    assert (2, True, True) in seen and engine._ring.stats()["pages_streamed"] > 0


@pytest.mark.parametrize(("pooled", "admitted"), [(True, 1), (False, 4)])
def test_a_move_keeps_the_ring_when_pooled_and_refills_it_when_reserved(tiny_llama_dir, pooled, admitted):
    """A 40-token conversation (47 cells: pages 0-2) moves to another lane, then a follow-up
    takes it to 60 cells (page 3). Pooled, the move hands the chunk table over: its pages stay
    resident and only page 3 is admitted. Reserved, the move copies the K/V into the other
    lane's chunks: those are new pages to the ring, so all 4 are admitted."""
    pool = {"kv_pool_tokens": 3 * 11 * 16} if pooled else {}
    engine = Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=MAX_CONTEXT, kv_chunk=16,
                                 batch=2, kv_resident=MAX_CONTEXT, kv_page=PAGE, kv_ring_adapt=False,
                                 devices=(DEVICE,), **pool), progress=False)
    first = list(range(900, 940))
    (out,) = run(engine, [first])
    lane = next(ln.index for ln in engine._scheduler.lanes if ln.conv is not None)
    engine.move(lane, (lane + 1) % 3)
    before = engine._ring.counters.pages_admitted
    run(engine, [first + out + list(range(60, 65))])
    assert engine._ring.counters.pages_admitted - before == admitted




def test_an_ended_request_gives_its_ring_back_to_the_budget(tiny_llama_dir):
    """Cap 96 cells, default ring 32, budget 96 + 32; every lane holds an idle conversation,
    so each new request displaces the least recently used one (a lane other than the last
    request's). A long request alone takes the cap; so does the next one alone, on another
    lane, because the first gave its ring back when it ended. Two long ones at once: one
    takes the cap, the other keeps the default ring, and that is the only fallback."""
    engine = Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=MAX_CONTEXT, kv_chunk=16,
                                 batch=2, prefill_chunk=13, kv_resident=96, kv_page=PAGE, kv_ring_default=32,
                                 kv_ring_adapt=True, kv_ring_budget=96 + 32, devices=(DEVICE,)), progress=False)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    lanes = engine._ring.counters.lanes

    def long(request_id: str, start: int) -> None:
        engine.submit(list(range(start, start + 80)), params, request_id)

    for i in range(3):
        engine.submit([7 + i, 8, 9], SamplingParams(temperature=0, max_tokens=2), f"short-{i}")
    engine.run_until_done()
    long("a", 100)
    engine.run_until_done()
    long("b", 200)
    engine.run_until_done()
    ring_of = {r.request_id: (lane, r.ring_cells) for lane, r in lanes.items()}
    assert ring_of["a"][0] != ring_of["b"][0] and ring_of["a"][1] == ring_of["b"][1] == 96
    assert engine._ring.counters.budget_fallbacks == 0
    long("c", 300)
    long("d", 400)
    engine.run_until_done()
    assert sorted(r.ring_cells for r in lanes.values() if r.request_id in ("c", "d")) == [32, 96]
    assert engine._ring.counters.budget_fallbacks == 1


@pytest.mark.parametrize("decode_path", FUSED_ONLY)
def test_prompt_pieces_read_through_the_ring_as_without_it(tiny_llama_dir, decode_path):
    """With the fused decode attention, a prompt's pieces are read row by row over each row's
    cells (runner/inputs.py, runner/ring_reads.py): with or without a ring, holding the whole
    conversation or a page of it, every position's logits are the same bits (an SDPA read of the
    pieces through the ring differs in the last bits, float32 included)."""
    from strata.testing import prompt_logits

    def engine(**ring) -> Engine:
        return Engine(EngineConfig(model=tiny_llama_dir, dtype="float32", max_context=MAX_CONTEXT, kv_chunk=16,
                                   batch=1, prefill_chunk=13, devices=(DEVICE,), **ring), progress=False)

    prompt = [(37 * i) % 1000 + 5 for i in range(70)]
    want = prompt_logits(engine(), prompt)
    for cells in (MAX_CONTEXT, PAGE):
        ringed = engine(kv_resident=cells, kv_page=PAGE, kv_ring_adapt=False)
        assert torch.equal(prompt_logits(ringed, prompt), want), cells


def test_a_layers_view_is_kept_until_its_arena_or_staging_changes(engines):
    """The ring hands a layer the same K/V view every step while its buffers stay (what the fused
    kernels write and read in place is worked out once: cells/ring_cells.py), and new views that
    name the new buffers once the arena is remade or staging grows; decoding through them after
    either change still equals decoding without a ring."""
    engine = engines(False, 16, False, "f32", 1)
    engine._scheduler.clear_cache()
    ring = engine._ring.full
    prompt = list(range(3, 60))  # 57 cells and 8 new in a ring of one 16-cell page: most pages stream
    assert run(engine, [prompt])[0] == reference(engines, prompt, "f32")
    k, v = ring.layer_views()[0]
    assert k.state.host_index is not None and k.state is v.state  # the steps decoded through this view
    assert ring.layer_views()[0][0] is k and ring.layer_views()[0][1] is v
    ring.resize_arena(ring.budget_cells + PAGE)
    k2, v2 = ring.layer_views()[0]
    assert k2 is not k and k2.arena is ring.arena_k[0] and v2.arena is ring.arena_v[0]
    ring._ensure_staging(2 * k2.staging.shape[1])
    k3, v3 = ring.layer_views()[0]
    assert k3 is not k2 and (k3.staging, v3.staging) == ring.staging_of(0)
    engine._scheduler.clear_cache()
    assert run(engine, [prompt])[0] == reference(engines, prompt, "f32")

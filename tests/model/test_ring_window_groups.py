"""The resident ring per layer group (cells/ring_groups.py) gives the tokens of the layout that keeps everything.

Tiny random Gemma 3 (sliding and global layers) and Mistral-style (every layer windowed) models,
float32, windows of 8 to 64 cells, chunks of 16 and 64, pages of 16: pooled with `--kv-resident`,
each windowed group read through its own ring, answers every request (several lanes at once,
growth past many windows, follow-ups, branches, lane moves and parks) with the tokens of the
reserved layout without a ring, which keeps every cell of every layer. Rings that hold the
window (then the windowed groups stream nothing) and rings of one page (they stream), under
both policies of the full group. After every step each ring's residency is consistent.

And by the ring's byte counters: a windowed group whose ring holds its window and step copies
zero bytes from the pool, across growth past many windows, while the full group, whose ring is
smaller than the conversation, streams.
"""

from __future__ import annotations

import functools
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.kv.ring_rule import window_ring_cells
from strata.sampling import SamplingParams
from tests.conftest import require
from tests.model.engine_runs import move_or_park, run_requests
from tests.model.test_window_group_layouts import model_dirs  # noqa: F401 (a fixture: tiny Gemma 3 / Mistral dirs)

require("transformers")

MAX_CONTEXT = 192
NEW = 10
PAGE = 16
PREFILL = 5
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
WINDOWS = (8, 20, 64)
CHUNKS = (16, 64)
ARCHS = ("gemma3_text", "mistral")
DEVICE = os.environ.get("STRATA_TEST_DEVICES", "cpu")

tokens_st = st.lists(st.integers(3, 40000), min_size=1, max_size=110)


def window_ring(window: int) -> int:
    return window_ring_cells(window, PREFILL, PAGE)


@pytest.fixture(scope="module")
def engines(model_dirs):
    @functools.cache
    def get(arch: str, window: int, chunk: int, ring: str | None, policy: str = "clock") -> Engine:
        """`ring`: "window" (a ring that holds the window and a step), "page" (one page), None (no
        ring: the reserved layout, every cell kept)."""
        extra = {}
        if ring is not None:
            cells = window_ring(window) if ring == "window" else PAGE
            extra = {"kv_pool_tokens": 3 * (-(-MAX_CONTEXT // chunk) + 1) * chunk, "kv_resident": cells,
                     "kv_page": PAGE, "kv_evict": policy, "kv_ring_adapt": False}
        cfg = EngineConfig(model=model_dirs(arch, window), dtype="float32", max_context=MAX_CONTEXT, kv_chunk=chunk,
                           batch=2, prefill_chunk=PREFILL, devices=(DEVICE if ring else "cpu",), **extra)
        engine = Engine(cfg, progress=False)
        if ring is not None:
            assert len(engine._ring.rings) == len(engine._layout.window_pools) + 1 > 1
        return engine

    return get


def run(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    return run_requests(engine, prompts, GREEDY, lambda e: e._ring is not None and e._ring.check())


def keep_everything(engines, arch: str, window: int, prompts: list[list[int]]) -> list[list[int]]:
    ref = engines(arch, window, 64, None)
    ref._scheduler.clear_cache()
    return [run(ref, [p])[0] for p in prompts]


RINGS = (("window", "clock"), ("window", "lrfu"), ("page", "clock"), ("page", "lrfu"))
geometry = st.builds(lambda arch, window, chunk, ring: (arch, window, chunk, *ring), st.sampled_from(ARCHS),
                     st.sampled_from(WINDOWS), st.sampled_from(CHUNKS), st.sampled_from(RINGS))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(geo=geometry, prompts=st.lists(tokens_st, min_size=1, max_size=3))
def test_batched_lanes_through_group_rings_equal_keep_everything(engines, geo, prompts):
    engine = engines(*geo)
    engine._scheduler.clear_cache()
    assert run(engine, prompts) == keep_everything(engines, geo[0], geo[1], prompts)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(geo=geometry, first=tokens_st, follow=st.lists(st.integers(3, 40000), min_size=1, max_size=30),
       cut=st.floats(0.0, 1.0), branch=st.lists(st.integers(3, 40000), min_size=1, max_size=20),
       action=st.sampled_from(["stay", "move", "park"]))
def test_follow_ups_branches_moves_through_group_rings(engines, geo, first, follow, cut, branch, action):
    engine = engines(*geo)
    engine._scheduler.clear_cache()
    (out,) = run(engine, [first])
    if action != "stay":
        move_or_park(engine, action)
    second = first + out + follow
    (b,) = run(engine, [second])
    third = second[: max(1, int(len(second) * cut))] + branch
    (c,) = run(engine, [third])
    assert [b, c] == keep_everything(engines, geo[0], geo[1], [second, third])


@pytest.mark.parametrize(("arch", "window", "chunk"), [("gemma3_text", 8, 16), ("gemma3_text", 20, 64),
                                                       ("mistral", 8, 64)])
def test_a_window_ring_streams_nothing_and_the_full_group_streams(engines, arch, window, chunk):
    """Two conversations grow to ~170 cells (many windows) through rings of window + step: the
    windowed groups copy no byte and read every page in place; the full group's ring (the same
    cells, far fewer than the conversation) streams. Then a follow-up after a park: the same."""
    engine = engines(arch, window, chunk, "window")
    engine._scheduler.clear_cache()
    before = [dict(g) for g in engine._ring.stats()["groups"]]
    a, b = list(range(100, 250)), list(range(300, 420))
    want = keep_everything(engines, arch, window, [a, b])
    assert run(engine, [a, b]) == want
    move_or_park(engine, "park")
    follow = a + want[0] + list(range(7, 12))
    assert run(engine, [follow]) == keep_everything(engines, arch, window, [follow])
    groups = engine._ring.stats()["groups"]
    assert [g["window"] for g in groups] == [None, window]
    for g, was in zip(groups[1:], before[1:]):
        assert g["layers"] > 0 and g["bytes_streamed"] == was["bytes_streamed"]
        assert g["pages_streamed"] == was["pages_streamed"] and g["hit_ratio"] > 0
    full = groups[0]
    if full["layers"]:
        assert full["bytes_streamed"] > before[0]["bytes_streamed"]
    for lane in range(2):
        stats = engine._ring.lane_stats(lane)
        if stats is not None:
            assert stats["window_rings"] == {str(window): min(window_ring(window), stats["ring_cells"])}


@pytest.mark.parametrize(("arch", "window", "chunk", "ring"), [("gemma3_text", 8, 16, "window"),
                                                               ("mistral", 20, 16, "page")])
def test_a_session_round_trip_through_group_rings(engines, tmp_path, arch, window, chunk, ring):
    """Save a conversation grown past many windows (format version 2), drop it, let another
    conversation's K/V take its chunks and the rings, restore it: the follow-up through every
    group's ring gives the keep-everything tokens from the restored cells."""
    engine = engines(arch, window, chunk, ring)
    engine._scheduler.clear_cache()
    first = list(range(100, 230))
    (out,) = run(engine, [first, list(range(500, 560))])[:1]  # a second lane fills the rings with other cells
    path = str(tmp_path / "conv.strata")
    engine.save_session(path, token_ids=first + out)
    engine._scheduler.clear_cache()
    run(engine, [list(range(700, 840))])  # other K/V now sits where the saved conversation's did
    engine._scheduler.clear_cache()
    engine.restore_session(path)
    follow = first + out + list(range(7, 15))
    assert run(engine, [follow]) == keep_everything(engines, arch, window, [follow])
    assert engine._scheduler.counters.num_cached_tokens > 0

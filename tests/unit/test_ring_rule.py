"""The ring sizing rule (DESIGN.md), as a table, and how it is switched on and configured."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata.config import EngineConfig
from strata.errors import ConfigError
from strata.kv.groups import window_start
from strata.kv.ring_rule import (ADAPT_ENV, DEFAULT_RING, RESIDENT_MIN, RingSizing, ring_adapt_enabled,
                                 window_ring_cells)

CAP = 49152
PAGE = 256


@pytest.mark.parametrize(
    ("prompt", "max_new", "ring"),
    [
        (1024, 256, 32768),  # the 1K tier keeps the default ring
        (32768, 256, 32768),  # the 32K tier: needed 33280 < cap, so it keeps the default ring too
        (131072, 256, CAP),  # the 128K tier gets the cap
        (CAP - 256 - PAGE, 256, CAP),  # needed == cap exactly: the cap
        (CAP - 256 - PAGE - 1, 256, CAP),  # rounded up to a page it reaches the cap
        (CAP - 256 - 2 * PAGE, 256, 32768),  # one page short of the cap after rounding
        (1, 0, 32768),
    ],
)
def test_rule_table(prompt, max_new, ring):
    assert RingSizing(CAP, PAGE, DEFAULT_RING, adaptive=True).ring_cells(prompt, max_new) == ring


def test_without_adapt_every_run_gets_the_cap():
    s = RingSizing(CAP, PAGE, DEFAULT_RING, adaptive=False)
    assert [s.ring_cells(p, 256) for p in (1024, 32768, 131072)] == [CAP, CAP, CAP]


def test_rounding_to_a_page():
    # needed = round_up(100 + 20 + 64, 64) = 192: at a cap of 190 (in pages: 192) it is the cap
    s = RingSizing(190, 64, 64, adaptive=True)
    assert s.ring_cells(100, 20) == 192
    assert s.ring_cells(60, 4) == 64  # needed 128 < 190: the default ring
    assert RingSizing(100, 64, 4096).cap_cells == 128  # a cap inside a page covers it


def test_the_floor_and_a_tiny_default_ring():
    # A tiny --kv-ring-default (scaled-down runs): the floor is resident_min, in whole pages.
    assert RingSizing(4096, 16, 1, adaptive=True).ring_cells(10, 10) == RESIDENT_MIN
    assert RingSizing(4096, 64, 1, adaptive=True).ring_cells(10, 10) == 64
    assert RingSizing(4096, 16, 100, adaptive=True).ring_cells(10, 10) == 112
    # the default ring never exceeds the cap: a lane keeps at most --kv-resident cells
    assert RingSizing(1024, 16, DEFAULT_RING, adaptive=True).ring_cells(10, 10) == 1024


@pytest.mark.parametrize(("value", "on"), [(None, False), ("", False), ("0", False), ("false", False),
                                           ("FALSE", False), (" 0 ", False), ("1", True), ("true", True)])
def test_adapt_env(value, on):
    env = {} if value is None else {ADAPT_ENV: value}
    assert ring_adapt_enabled(env) is on


@pytest.mark.parametrize("value", ["maybe", "2", "yes-please", "on?"])
def test_adapt_env_bad_value_names_the_variable(value):
    with pytest.raises(ConfigError, match=ADAPT_ENV):
        ring_adapt_enabled({ADAPT_ENV: value})


def test_engine_config_reads_the_environment(monkeypatch):
    monkeypatch.setenv(ADAPT_ENV, "1")
    assert EngineConfig(kv_resident=64).ring_sizing.adaptive
    monkeypatch.setenv(ADAPT_ENV, "0")
    assert not EngineConfig(kv_resident=64).ring_sizing.adaptive
    monkeypatch.setenv(ADAPT_ENV, "maybe")
    with pytest.raises(ConfigError, match=ADAPT_ENV):
        EngineConfig(kv_resident=64)


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"kv_resident": 0}, "--kv-resident"),
        ({"kv_resident": -5}, "--kv-resident"),
        ({"kv_resident": RESIDENT_MIN - 1}, "--kv-resident"),
        ({"kv_resident": 64, "kv_page": 48}, "--kv-page"),  # does not divide the chunk
        ({"kv_resident": 64, "kv_page": 8}, "--kv-page"),
        ({"kv_resident": 64, "kv_evict": "lru"}, "--kv-evict"),
        ({"kv_resident": 64, "kv_ring_default": 0}, "--kv-ring-default"),
        ({"kv_resident": 64, "kv_ring_budget": 8}, "--kv-ring-budget"),
        ({"kv_ring_budget": 4096}, "--kv-ring-budget"),  # without a ring
    ],
)
def test_bad_flags_name_the_flag(kwargs, flag):
    with pytest.raises(ConfigError, match=flag):
        EngineConfig(kv_ring_adapt=False, **kwargs)


def test_budget_defaults_to_every_lane_at_the_cap():
    cfg = EngineConfig(kv_resident=1000, kv_page=64, batch=3, kv_ring_adapt=False)
    assert cfg.ring_budget == 4 * 1024
    assert EngineConfig(kv_resident=1000, kv_ring_budget=5000, kv_ring_adapt=False).ring_budget == 5000
    assert EngineConfig(kv_chunk=16).page == 16 and EngineConfig().page == 256



@given(window=st.integers(1, 2048), step=st.integers(1, 1024), page=st.sampled_from([16, 64, 256]),
       start=st.integers(0, 100_000))
def test_a_window_ring_holds_every_page_a_windowed_step_reads(window, step, page, start):
    """A step writing `step` cells from `start` reads positions window_start(start) .. start + step - 1
    through a window: those pages fit the window ring (cells/ring_groups.py), whatever the offsets."""
    first = window_start(start, window)
    pages = (start + step - 1) // page - first // page + 1
    assert pages * page <= window_ring_cells(window, step, page)

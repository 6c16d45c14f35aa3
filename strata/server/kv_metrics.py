"""Prometheus families for the resident K/V ring (`--kv-resident`) and speculative decoding
(`--spec`), from an engine snapshot."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from strata.engine.interface import EngineSnapshot


def ring_metrics(snap: EngineSnapshot) -> Iterator[Metric]:
    ring = snap.ring
    if ring is None:
        return
    cells = GaugeMetricFamily("strata_kv_ring_cells", "cells per layer a lane keeps on the device", labels=["lane"])
    resident = GaugeMetricFamily("strata_kv_ring_lane_resident_pages",
                                 "pages of the lane's conversation resident after the last step", labels=["lane"])
    hits = GaugeMetricFamily("strata_kv_ring_lane_hit_ratio", "pages read in place / pages read, per lane",
                             labels=["lane"])
    for lane in snap.lanes:
        if lane.ring is not None:
            cells.add_metric([str(lane.index)], lane.ring["ring_cells"])
            resident.add_metric([str(lane.index)], lane.ring["resident_pages"])
            hits.add_metric([str(lane.index)], lane.ring["hit_ratio"])
    yield from (cells, resident, hits)
    yield GaugeMetricFamily("strata_kv_ring_budget_cells", "device cells per layer for all rings",
                            value=ring["budget_cells"])
    yield GaugeMetricFamily("strata_kv_ring_page_cells", "cells per page", value=ring["page"])
    yield GaugeMetricFamily("strata_kv_ring_resident_pages", "pages resident in the device arena",
                            value=ring["resident_pages"])
    yield GaugeMetricFamily("strata_kv_ring_hit_ratio", "pages read in place / pages read", value=ring["hit_ratio"])
    yield GaugeMetricFamily("strata_kv_ring_bytes_streamed_per_token",
                            "bytes copied from the pool to the device per token computed",
                            value=ring["bytes_streamed_per_token"])
    for name, doc, key in (
        ("strata_kv_ring_pages_streamed", "pages copied into staging for one step", "pages_streamed"),
        ("strata_kv_ring_pages_admitted", "pages copied into the arena to stay", "pages_admitted"),
        ("strata_kv_ring_bytes_streamed", "bytes copied from the pool to the device", "bytes_streamed"),
        ("strata_kv_ring_budget_fallbacks", "lanes kept at the default ring because the budget was spent",
         "budget_fallbacks"),
    ):
        yield CounterMetricFamily(name, doc, value=ring[key])
    if "groups" in ring:  # a ring per layer group (cells/ring_groups.py): the totals above sum them
        streamed = CounterMetricFamily("strata_kv_ring_group_bytes_streamed",
                                       "bytes copied from the pool to the device, per layer group", labels=["window"])
        arena = GaugeMetricFamily("strata_kv_ring_group_arena_cells", "device cells per layer of the group's arena",
                                  labels=["window"])
        for g in ring["groups"]:
            label = ["full" if g["window"] is None else str(g["window"])]
            streamed.add_metric(label, g["bytes_streamed"])
            arena.add_metric(label, g["budget_cells"])
        yield from (streamed, arena)


def spec_metrics(snap: EngineSnapshot) -> Iterator[Metric]:
    spec = snap.spec
    if spec is None:
        return
    yield CounterMetricFamily("strata_spec_verify_steps", "lane steps that verified drafts", value=spec.num_steps)
    yield CounterMetricFamily("strata_spec_draft_tokens", "draft tokens proposed", value=spec.num_drafted)
    yield CounterMetricFamily("strata_spec_accepted_tokens", "draft tokens kept", value=spec.num_accepted)
    yield GaugeMetricFamily("strata_spec_acceptance_ratio", "draft tokens kept / proposed, since start",
                            value=spec.num_accepted / spec.num_drafted if spec.num_drafted else 0.0)
    lanes = GaugeMetricFamily("strata_spec_lane_acceptance_ratio", "the running request's kept / proposed drafts",
                              labels=["lane"])
    for lane in snap.lanes:
        if lane.spec is not None:
            lanes.add_metric([str(lane.index)], lane.spec["acceptance"])
    yield lanes

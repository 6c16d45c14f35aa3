"""Prometheus families for the expert cache (`--moe-resident`) and the device budget
(`--device-memory`), from an engine snapshot: `strata_moe_*`."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from strata.engine.interface import EngineSnapshot

TOTALS = (
    ("strata_moe_expert_hits", "expert runs from a slot the expert already held", "hits"),
    ("strata_moe_expert_misses", "expert runs that found the expert in no slot", "misses"),
    ("strata_moe_expert_host_runs", "misses run where the expert lives (host memory)", "host_runs"),
    ("strata_moe_expert_evictions", "experts displaced from their slot", "evictions"),
    ("strata_moe_expert_prefetches", "experts copied ahead by prefetch", "prefetches"),
    ("strata_moe_expert_prefetch_hits", "first uses of a prefetched expert", "prefetch_hits"),
    ("strata_moe_expert_prefetch_wasted", "prefetched experts displaced before any use", "prefetch_wasted"),
    ("strata_moe_bytes_copied", "expert bytes copied from host memory into slots", "bytes_copied"),
    ("strata_moe_tokens", "tokens the MoE layers computed", "tokens"),
)


def moe_metrics(snap: EngineSnapshot) -> Iterator[Metric]:
    moe = snap.moe
    if moe is None:
        return
    yield GaugeMetricFamily("strata_moe_expert_slots", "expert slots per MoE layer on the compute device",
                            value=moe["resident"])
    yield GaugeMetricFamily("strata_moe_slot_bytes", "bytes of every expert slot together", value=moe["slot_bytes"])
    yield GaugeMetricFamily("strata_moe_hit_ratio", "expert runs from a slot / expert runs", value=moe["hit_ratio"])
    yield GaugeMetricFamily("strata_moe_bytes_copied_per_token", "expert bytes copied per token computed",
                            value=moe["bytes_copied_per_token"])
    for name, doc, key in TOTALS:
        yield CounterMetricFamily(name, doc, value=moe[key])
    per_layer = {k: CounterMetricFamily(f"strata_moe_layer_{k}", f"expert {k.replace('_', ' ')}, per MoE layer",
                                        labels=["layer"]) for k in ("hits", "misses", "evictions", "bytes_copied")}
    for layer in moe["layers"]:
        for k, family in per_layer.items():
            family.add_metric([str(layer["layer"])], layer[k])
    yield from per_layer.values()
    budget = moe["budget"]
    if budget is None:
        return
    yield GaugeMetricFamily("strata_moe_budget_bytes", "the device budget (--device-memory)",
                            value=budget["device_bytes"])
    split = GaugeMetricFamily("strata_moe_budget_split_bytes", "the device budget's current split", labels=["part"])
    for part in ("resident", "expert", "ring", "free"):
        split.add_metric([part], budget[f"{part}_bytes"])
    yield split
    yield CounterMetricFamily("strata_moe_budget_changes", "changes of the split", value=budget["changes"])
    yield CounterMetricFamily("strata_moe_budget_fallbacks", "rings kept at the floor for want of budget",
                              value=budget["fallbacks"])

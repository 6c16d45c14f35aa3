"""The front door's /metrics merges replicas' expositions, each sample labelled."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from strata.cluster.metrics import FrontMetrics, merge_replica_metrics

A = '''# HELP strata_kv_chunks KV pool chunks by state
# TYPE strata_kv_chunks gauge
strata_kv_chunks{state="free"} 10.0
strata_kv_chunks{state="held"} 2.0
# HELP strata_requests_total requests
# TYPE strata_requests_total counter
strata_requests_total{route="/v1/completions",status="200"} 3.0
'''
B = A.replace("10.0", "7.0").replace(" 3.0", " 5.0")


def test_every_sample_keeps_its_value_under_its_replica():
    merged = merge_replica_metrics({"a": A, "b": B})
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(merged) for s in f.samples}
    assert samples[("strata_kv_chunks", (("replica", "a"), ("state", "free")))] == 10.0
    assert samples[("strata_kv_chunks", (("replica", "b"), ("state", "free")))] == 7.0
    assert samples[("strata_requests_total", (("replica", "b"), ("route", "/v1/completions"), ("status", "200")))] == 5.0
    assert len(samples) == 6 and merged.count("# TYPE strata_kv_chunks gauge") == 1


def test_the_front_door_counters_come_first_and_parse():
    m = FrontMetrics()
    m.requests.labels("a", "prefix").inc()
    text = m.render({"a": A}).decode()
    names = [f.name for f in text_string_to_metric_families(text)]
    assert names[0] == "strata_cluster_requests" and "strata_kv_chunks" in names
    assert merge_replica_metrics({}) == ""

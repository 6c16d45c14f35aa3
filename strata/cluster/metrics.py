"""The front door's /metrics: its own routing counters, then every replica's `strata serve`
metrics, each sample labelled with its `replica` (the same names as a single server's)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString


class FrontMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("strata_cluster_requests", "requests forwarded, by replica and routing reason",
                                ["replica", "route"], registry=self.registry)
        self.migrated = Counter("strata_cluster_migrated_tokens", "prompt tokens whose K/V came from another replica",
                                registry=self.registry)
        self.migrations = Counter("strata_cluster_migrations", "turns that pulled their prefix from another replica",
                                  registry=self.registry)
        self.failures = Counter("strata_cluster_replica_failures", "requests a failing replica ended",
                                registry=self.registry)

    def render(self, replicas: Mapping[str, str]) -> bytes:
        """These counters, then `replicas` (replica id -> its /metrics text) merged."""
        return generate_latest(self.registry) + merge_replica_metrics(replicas).encode()


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def merge_replica_metrics(replicas: Mapping[str, str]) -> str:
    """One exposition of every replica's families: HELP and TYPE once per family, each
    sample with a `replica` label added."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for replica, text in sorted(replicas.items()):
        for family in text_string_to_metric_families(text):
            _, _, lines = families.setdefault(family.name, (family.type, family.documentation, []))
            for s in family.samples:
                labels = {"replica": replica, **s.labels}
                body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                lines.append(f"{s.name}{{{body}}} {floatToGoString(s.value)}")
    out = []
    for name, (kind, doc, lines) in families.items():
        out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *lines]
    return "\n".join(out) + ("\n" if out else "")

"""Prometheus metrics of one server, in its own registry (no process-wide state).

Request metrics are observed where the facts happen: HTTP outcomes in the middleware,
tokens and latencies on the engine thread (prometheus-client is thread-safe). Pool
gauges and counters are read at scrape time from the engine thread's latest snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from strata.server.kv_metrics import ring_metrics, spec_metrics
from strata.server.moe_metrics import moe_metrics
from strata.engine.interface import EngineSnapshot, RequestOutput

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)


class PoolCollector(Collector):
    """The pool's gauges and counters, from the latest snapshot (nothing before loading)."""

    def __init__(self, snapshot: Callable[[], EngineSnapshot | None]):
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        if snap is None:
            return
        pool, counters = snap.pool, snap.counters
        by_state = {
            "total": pool.num_chunks_total,
            "held": pool.num_chunks_held,  # = active + parked + session
            "free": pool.num_chunks_free,
            "active": snap.num_chunks_active,  # in tables of running requests
            "parked": pool.num_chunks_parked,  # held only by idle conversations
            "session": pool.num_chunks_session,  # held only by session files in flight (saves, restores)
        }
        chunks = GaugeMetricFamily(
            "strata_kv_chunks", "KV pool chunks by state (held = active + parked + session)", labels=["state"]
        )
        cells = GaugeMetricFamily(
            "strata_kv_cells",
            "KV pool cells per layer by state (chunks x chunk size)",
            labels=["state"],
        )
        for state, n in by_state.items():
            chunks.add_metric([state], n)
            cells.add_metric([state], n * pool.chunk_size)
        yield chunks
        yield cells
        if pool.groups:  # sliding-window layer groups: each its own pool of chunks (docs/windows.md)
            group = GaugeMetricFamily("strata_kv_window_chunks", "chunks of a sliding-window layer group's pool "
                                      "(kept: of the held, those held only for kept windows)",
                                      labels=["window", "state"])
            layers = GaugeMetricFamily("strata_kv_window_layers", "layers of a sliding-window layer group",
                                       labels=["window"])
            assert len(snap.group_layers) == 1 + len(pool.groups), "a windowed group without its layers"
            for g, num_layers in zip(pool.groups, snap.group_layers[1:]):
                for state, n in (("total", g.num_chunks_total), ("held", g.num_chunks_held),
                                 ("free", g.num_chunks_free), ("kept", g.num_chunks_kept)):
                    group.add_metric([str(g.window), state], n)
                layers.add_metric([str(g.window)], num_layers)
            yield group
            yield layers
        yield GaugeMetricFamily("strata_kv_chunk_cells", "cells per chunk", value=pool.chunk_size)
        yield GaugeMetricFamily("strata_sessions_in_flight", "session files being saved or restored",
                                value=pool.num_sessions)
        yield GaugeMetricFamily(
            "strata_kv_bytes_per_cell",
            "K/V bytes of one position, all layers",
            value=snap.bytes_per_cell,
        )
        yield GaugeMetricFamily(
            "strata_kv_usage_ratio", "held chunks / total chunks", value=snap.usage_ratio
        )
        yield GaugeMetricFamily(
            "strata_kv_chunks_shared",
            "chunks held by more than one conversation (shared prefixes), counted once",
            value=pool.num_chunks_shared,
        )
        yield GaugeMetricFamily(
            "strata_kv_cells_saved",
            "cells per layer that shared prefixes save: (holders - 1) x chunk size, summed",
            value=pool.num_cells_saved,
        )
        yield GaugeMetricFamily(
            "strata_kv_conversations_parked",
            "idle conversations whose K/V stays in the pool",
            value=pool.num_conversations_parked,
        )
        for name, doc, value in (
            ("strata_kv_evictions", "parked conversations that gave way", counters.num_evictions),
            (
                "strata_kv_refusals",
                "requests refused because the pool was full",
                counters.num_refusals,
            ),
            (
                "strata_kv_truncations",
                "answers ended because the pool could not grow them",
                counters.num_truncations,
            ),
            (
                "strata_kv_cells_copied",
                "K/V cells copied (forks, reserved-layout moves)",
                counters.num_cells_copied,
            ),
            (
                "strata_kv_bytes_copied",
                "K/V bytes copied (forks, reserved-layout moves; 0 for pool moves)",
                counters.num_cells_copied * snap.bytes_per_cell,
            ),
            (
                "strata_kv_cached_tokens",
                "prompt tokens whose K/V were reused",
                counters.num_cached_tokens,
            ),
            (
                "strata_failed_steps",
                "steps whose execute failed (their requests ended with server_error)",
                counters.num_failed_steps,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        moves = CounterMetricFamily(
            "strata_kv_moves", "conversations moved between lanes", labels=["kind"]
        )
        moves.add_metric(["swap"], counters.num_moves_swap)
        moves.add_metric(["copy"], counters.num_moves_copy)
        yield moves
        yield GaugeMetricFamily(
            "strata_requests_running", "requests holding a lane", value=snap.num_running
        )
        yield GaugeMetricFamily(
            "strata_requests_queued",
            "requests in the engine waiting for a lane",
            value=snap.num_queued,
        )
        yield from ring_metrics(snap)
        yield from spec_metrics(snap)
        yield from moe_metrics(snap)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "strata_http_requests",
            "HTTP requests by route and status code",
            ["route", "status"],
            registry=r,
        )
        self.finished = Counter(
            "strata_requests_finished",
            "generations by finish reason",
            ["finish_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "strata_prompt_tokens", "prompt tokens of finished requests", registry=r
        )
        self.generation_tokens = Counter("strata_generation_tokens", "tokens generated", registry=r)
        self.ttft = Histogram(
            "strata_time_to_first_token_seconds",
            "from arrival to the first new token",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "strata_inter_token_latency_seconds",
            "between consecutive new tokens of a request",
            buckets=ITL_BUCKETS,
            registry=r,
        )

    def observe(self, out: RequestOutput) -> None:
        """One output of the engine: tokens, latencies (the first token's since arrival: TTFT),
        and the finish reason."""
        if out.new_token_ids:
            self.generation_tokens.inc(len(out.new_token_ids))
            if out.latency_s is not None:
                first = out.num_output_tokens == len(out.new_token_ids)
                (self.ttft if first else self.itl).observe(out.latency_s)
        if out.finished:
            self.finished.labels(out.finish_reason or "unknown").inc()
            if out.error is None:
                self.prompt_tokens.inc(out.num_prompt_tokens)

    def add_pool(self, snapshot: Callable[[], EngineSnapshot | None]) -> None:
        """Export the pool, read from `snapshot()` at each scrape."""
        self.registry.register(PoolCollector(snapshot))

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""The printed table: arms side by side per workload (also kept in cluster.json)."""

from __future__ import annotations

from benchmarks.common import print_table

COLUMNS = ["workload", "arm", "TTFT p50 ms", "TTFT p99 ms", "p50 / rr", "p99 / rr", "hit ratio", "out tok/s",
           "tok/s / rr", "migrations (hdr/metric)", "migrated TTFT p50", "busiest replica", "routes", "errors",
           "loadavg"]


def _ratio(s: dict, k: str) -> str:
    """The median paired ratio, and its range over rounds when there were several."""
    if "vs_rr" not in s:
        return "-"
    v = s["vs_rr_rounds"][k]
    return f"{s['vs_rr'][k]:.2f}" + (f" ({min(v):.2f}-{max(v):.2f})" if max(v) > min(v) else "")


def table(summaries: dict[str, dict[str, dict]], header: str) -> str:
    """One row per workload and arm; `loadavg` is the host's (other work on a shared machine)."""
    rows = []
    for w, arms in summaries.items():
        for arm, s in arms.items():
            routes = " ".join(f"{k}:{v}" for k, v in sorted(s["routes"].items()))
            rows.append([w, arm, s["ttft_p50_ms"], s["ttft_p99_ms"], _ratio(s, "ttft_p50_ms"),
                         _ratio(s, "ttft_p99_ms"), f"{s['hit_ratio']:.3f}", s["out_tok_s"], _ratio(s, "out_tok_s"),
                         f"{s['migrations']}/{s['migrations_metric']:.0f}",
                         "-" if s["migrated_ttft_p50_ms"] is None else f"{s['migrated_ttft_p50_ms']:.0f}",
                         f"{s['busiest_share']:.0%}", routes,
                         s["errors"], f"{s['loadavg_1m']:.1f}"])
    return print_table(f"follow-up turns through the front door (medians over rounds; / rr: paired with round "
                       f"robin per round, range over rounds in brackets). {header}", COLUMNS, rows)

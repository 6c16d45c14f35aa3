"""The numbers: percentiles per arm and level, the gap histogram, the stalls during another
request's prefill, and the table's columns and rows."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.serve_parts.client import Record


def pct(values: list[float], q: float) -> float:
    """The q-th percentile, linear between closest ranks (numpy's default)."""
    import numpy as np

    return float(np.percentile(values, q)) if values else float("nan")


def summarize(runs: list[dict], new: int) -> dict:
    """One arm at one level, its rounds pooled for the percentiles, throughput the median."""
    import statistics

    recs = [r for run in runs for r in run["records"]]
    ok = [r for r in recs if r.error is None and r.token_times]
    ttft = [r.ttft for r in ok]
    tpot = [r.tpot for r in ok]
    gaps = [g for r in ok for g in r.gaps]
    stream_max = [max(r.gaps, default=0.0) for r in ok]
    stalls = [stall_share([r for r in run["records"] if r.error is None and r.token_times]) for run in runs]
    out = {
        "requests": len(recs),
        "errors": len(recs) - len(ok),
        "ttft_p50_s": pct(ttft, 50), "ttft_p90_s": pct(ttft, 90), "ttft_p99_s": pct(ttft, 99),
        "tpot_p50_ms": 1e3 * pct(tpot, 50), "tpot_p90_ms": 1e3 * pct(tpot, 90),
        "tpot_p99_ms": 1e3 * pct(tpot, 99),
        "itl_p50_ms": 1e3 * pct(gaps, 50), "itl_p99_ms": 1e3 * pct(gaps, 99),
        "stream_gap_p50_ms": 1e3 * pct(stream_max, 50), "stream_gap_p90_ms": 1e3 * pct(stream_max, 90),
        "stream_gap_p99_ms": 1e3 * pct(stream_max, 99),
        "gap_max_ms": 1e3 * max(gaps, default=float("nan")),
        "gap_hist_ms": gap_histogram(gaps),
        "req_s": statistics.median(sum(1 for r in run["records"] if r.error is None) / run["wall_s"]
                                   for run in runs),
        "out_tok_s": statistics.median(
            sum(r.completion_tokens for r in run["records"] if r.error is None) / run["wall_s"]
            for run in runs),
        "prompt_tokens": sorted({r.prompt_tokens for r in ok}),
        "completion_tokens": sorted({r.completion_tokens for r in ok}),
        "token_events_min": min((len(r.token_times) for r in ok), default=0),
        "big_gaps": sum(x["count"] for x in stalls),
        "big_gaps_during_prefill": sum(x["during_prefill"] for x in stalls),
        "peer_idle_cpu_s": max(run["peer_cpu_s"] for run in runs),
        "others_cpu_pct": 100 * max(run["others_cpu_share"] for run in runs),
    }
    if len(ok) < len(recs):
        out["first_error"] = next(r.error for r in recs if r.error is not None)
    if out["completion_tokens"] != [new]:
        out["note"] = f"completion tokens {out['completion_tokens']}, expected {new}"
    return out


GAP_BINS_MS = (0, 25, 50, 75, 100, 150, 200, 300, 500, 1000, 2000, 5000)


def gap_histogram(gaps: list[float]) -> dict[str, int]:
    """How many gaps fall in each bin: the server's step times, as the streams felt them."""
    counts: dict[str, int] = {}
    for lo, hi in itertools.pairwise((*GAP_BINS_MS, math.inf)):
        n = sum(1 for g in gaps if lo <= 1e3 * g < hi)
        if n:
            counts[f"{lo}-{hi}" if hi != math.inf else f"{lo}+"] = n
    return counts


def stall_share(records: list[Record], factor: float = 2.0) -> dict:
    """Gaps over `factor` x the level's median gap, and how many of them overlap another
    request's prefill (its send .. its first token): what a prompt costs the streams already
    decoding."""
    gaps = [g for r in records for g in r.gaps]
    if not gaps:
        return {"count": 0, "during_prefill": 0}
    limit = factor * pct(gaps, 50)
    windows = [(r, r.sent, r.token_times[0]) for r in records]
    count = during = 0
    for r in records:
        for a, b in itertools.pairwise(r.token_times):
            if b - a <= limit:
                continue
            count += 1
            if any(o is not r and s < b and f > a for o, s, f in windows):
                during += 1
    return {"count": count, "during_prefill": during}


COLUMNS = [
    ("ttft_p50_s", "TTFT p50 s"), ("ttft_p90_s", "p90 s"), ("ttft_p99_s", "p99 s"),
    ("tpot_p50_ms", "TPOT p50 ms"), ("tpot_p90_ms", "p90 ms"), ("tpot_p99_ms", "p99 ms"),
    ("itl_p99_ms", "ITL p99 ms"), ("stream_gap_p50_ms", "max gap p50 ms"), ("stream_gap_p99_ms", "p99 ms"),
    ("gap_max_ms", "max ms"),
    ("req_s", "req/s"), ("out_tok_s", "out tok/s"),
]


def table_rows(summary: dict, arms: list[str], levels: list[int]) -> list[list]:
    rows = []
    for c in levels:
        for arm in arms:
            s = summary[arm][str(c)]
            rows.append([c, arm] + [s[k] for k, _ in COLUMNS]
                        + [f"{s['big_gaps_during_prefill']}/{s['big_gaps']}", f"{s['others_cpu_pct']:.0f}%"])
        for peer in arms[1:]:  # arms[0] is strata
            a, b = summary["strata"][str(c)], summary[peer][str(c)]
            rows.append([c, f"strata / {peer}"]
                        + [a[k] / b[k] if b[k] else float("nan") for k, _ in COLUMNS] + ["", ""])
    return rows

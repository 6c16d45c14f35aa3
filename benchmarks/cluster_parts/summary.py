"""Runs -> the numbers per arm: follow-up TTFT, cache hits, output tok/s, migrations, routes.

Per run (one arm, one workload, one round): follow-ups are turns 2.. of every
conversation; TTFT = first content chunk - request sent; hit ratio = sum cached_tokens /
sum prompt_tokens over follow-ups; output tok/s = completion tokens of all turns / the
run's wall time; migrated turns' TTFT is pooled over rounds. Across rounds: medians;
`/ rr` = the median over rounds of the arm's value / round robin's in the same round (the
runs of a round are back to back)."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import asdict

BASELINE = "round_robin"


def percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def front_counter(metrics: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+-]+)$", metrics, re.M)
    return float(m.group(1)) if m else float("nan")


def run_summary(run: dict) -> dict:
    recs = run["records"]
    ok = [r for r in recs if r.error is None]
    follow = [r for r in ok if r.turn > 0 and r.ttft is not None]
    migrated = [r.ttft for r in follow if r.migrated > 0]
    first = [r for r in ok if r.turn == 0 and r.ttft is not None]
    prompt = sum(r.prompt_tokens for r in follow)
    per_replica = Counter(r.replica for r in ok)
    return {
        "turns": len(recs), "errors": len(recs) - len(ok), "follow_ups": len(follow),
        "ttft_p50_ms": percentile([r.ttft for r in follow], 0.5) * 1e3,
        "ttft_p99_ms": percentile([r.ttft for r in follow], 0.99) * 1e3,
        "first_ttft_p50_ms": percentile([r.ttft for r in first], 0.5) * 1e3,
        "hit_ratio": sum(r.cached_tokens for r in follow) / prompt if prompt else float("nan"),
        "prompt_tokens": prompt, "cached_tokens": sum(r.cached_tokens for r in follow),
        "out_tok_s": sum(r.completion_tokens for r in ok) / run["wall_s"],
        "wall_s": run["wall_s"],
        "migrations": sum(1 for r in ok if r.migrated > 0), "migrated_tokens": sum(r.migrated for r in ok),
        "migrated_ttft_ms": [t * 1e3 for t in migrated],
        "migrations_metric": front_counter(run["front_metrics"], "strata_cluster_migrations_total"),
        "routes": dict(Counter(r.route for r in ok)),
        "busiest_share": max(per_replica.values()) / len(ok) if ok else float("nan"),
        "records": [asdict(r) for r in recs],
    }


NUMERIC = ("ttft_p50_ms", "ttft_p99_ms", "first_ttft_p50_ms", "hit_ratio", "out_tok_s", "wall_s", "busiest_share",
           "loadavg_1m")
SUMMED = ("turns", "errors", "follow_ups", "migrations", "migrated_tokens", "migrations_metric")
RATIOS = ("ttft_p50_ms", "ttft_p99_ms", "out_tok_s")


def arm_summary(runs: list[dict], baseline: list[dict] | None) -> dict:
    out = {k: statistics.median(r[k] for r in runs) for k in NUMERIC}
    out.update({k: sum(r[k] for r in runs) for k in SUMMED})
    routes: Counter = Counter()
    for r in runs:
        routes.update(r["routes"])
    out["routes"] = dict(routes)
    migrated = [t for r in runs for t in r["migrated_ttft_ms"]]
    out["migrated_ttft_p50_ms"] = percentile(migrated, 0.5) if migrated else None
    out["rounds"] = len(runs)
    if baseline:
        out["vs_rr_rounds"] = {k: [r[k] / b[k] for r, b in zip(runs, baseline)] for k in RATIOS}
        out["vs_rr"] = {k: statistics.median(v) for k, v in out["vs_rr_rounds"].items()}
    return out


def workload_summary(raw: dict[str, list[dict]]) -> dict[str, dict]:
    """arm -> its summary, ratios against round robin's runs when that arm ran."""
    base = raw.get(BASELINE)
    return {arm: arm_summary(runs, base) for arm, runs in raw.items() if runs}

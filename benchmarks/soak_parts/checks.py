"""What the server says about itself (/metrics, /slots, /health), sampled during the run and
judged after it.

The names are the ones strata/server/metrics.py and snapshot.py export:
`strata_kv_chunks{state=total|held|free|active|parked}` (held = active + parked; active:
in the tables of running requests; parked: held only by idle conversations),
`strata_requests_running`, `strata_requests_queued`, the counters `strata_kv_evictions_total`,
`strata_kv_refusals_total`, `strata_kv_truncations_total`, `strata_requests_finished_total
{finish_reason}` and `strata_http_requests_total{route,status}`; /slots lists each lane's
`state` (empty, idle, prefilling, decoding) and `chunks_held`.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time

BUSY_STATES = ("prefilling", "decoding")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample, keyed by its name plus labels as printed (e.g. 'strata_kv_chunks{state="held"}')."""
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def chunks(m: dict[str, float], state: str) -> int:
    return int(m.get(f'strata_kv_chunks{{state="{state}"}}', -1))


def labelled(m: dict[str, float], name: str, label: str) -> dict[str, float]:
    """{label value: sample} of one labelled family, e.g. finish reasons."""
    pat = re.compile(re.escape(name) + r"\{.*" + label + r'="([^"]*)".*\}')
    return {mm.group(1): v for k, v in m.items() if (mm := pat.fullmatch(k))}


def http_statuses(m: dict[str, float]) -> dict[str, float]:
    """{status: requests} over all routes."""
    out: dict[str, float] = {}
    for k, v in m.items():
        mm = re.fullmatch(r'strata_http_requests_total\{.*status="(\d+)".*\}', k)
        if mm:
            out[mm.group(1)] = out.get(mm.group(1), 0) + v
    return out


async def fetch_state(http, url: str) -> tuple[dict[str, float], list[dict], int]:
    m = parse_metrics((await http.get(url + "/metrics")).text)
    slots = (await http.get(url + "/slots")).json()
    health = (await http.get(url + "/health")).status_code
    return m, slots, health


async def sample(http, url: str, pid: int, load, samples: list[dict], every_s: float, stop: asyncio.Event) -> None:
    """Every `every_s`: the server's RSS, our requests in flight, and the pool, until `stop`."""
    import psutil

    proc = psutil.Process(pid)
    while not stop.is_set():
        row = {"t": time.perf_counter() - load.t0, "rss_mib": proc.memory_info().rss / 2**20,
               "in_flight": load.in_flight}
        try:
            m = parse_metrics((await http.get(url + "/metrics", timeout=10)).text)
            row.update(running=m.get("strata_requests_running", -1), queued=m.get("strata_requests_queued", -1),
                       held=chunks(m, "held"), parked=chunks(m, "parked"), total=chunks(m, "total"))
        except Exception as exc:  # noqa: BLE001 - a sample without the pool; the checks judge later
            row["metrics_error"] = f"{type(exc).__name__}: {exc}"
        samples.append(row)
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except asyncio.TimeoutError:
            pass


async def settle(http, url: str, timeout_s: float) -> tuple[dict[str, float], list[dict], int, float]:
    """Polls until no request runs or waits and no lane is busy (or `timeout_s` passes)."""
    t = time.perf_counter()
    while True:
        m, slots, health = await fetch_state(http, url)
        quiet = (m.get("strata_requests_running") == 0 and m.get("strata_requests_queued") == 0
                 and chunks(m, "active") == 0 and not any(s["state"] in BUSY_STATES for s in slots))
        waited = time.perf_counter() - t
        if quiet or waited > timeout_s:
            return m, slots, health, waited
        await asyncio.sleep(0.25)


def rss_flat(samples: list[dict], duration_s: float, tol_ratio: float, tol_mib: float) -> dict:
    """Median RSS of the last third of the run against the second third (the first is warm-up)."""
    def median_in(lo: float, hi: float) -> float:
        vals = [s["rss_mib"] for s in samples if lo <= s["t"] < hi]
        return statistics.median(vals) if vals else float("nan")

    warm, end = median_in(duration_s / 3, 2 * duration_s / 3), median_in(2 * duration_s / 3, duration_s + 1)
    limit = warm + max(tol_ratio * warm, tol_mib)
    # The trend after warm-up (least squares over the last two thirds), reported, not judged:
    # a run of minutes cannot tell allocator warm-up that will level off from a slow leak.
    return {"start_mib": samples[0]["rss_mib"] if samples else float("nan"), "warm_mib": warm, "end_mib": end,
            "max_mib": max((s["rss_mib"] for s in samples), default=float("nan")),
            "limit_mib": limit, "slope_mib_per_min": slope_after(samples, duration_s / 3),
            "last_half_mib_per_min": slope_after(samples, duration_s / 2), "ok": end <= limit}


def slope_after(samples: list[dict], t0: float) -> float:
    """RSS trend in MiB per minute (least squares) over the samples from `t0` seconds on."""
    after = [(s["t"], s["rss_mib"]) for s in samples if s["t"] >= t0]
    if len(after) < 3:
        return float("nan")
    mt, mr = statistics.fmean(t for t, _ in after), statistics.fmean(r for _, r in after)
    var = sum((t - mt) ** 2 for t, _ in after)
    return 60 * sum((t - mt) * (r - mr) for t, r in after) / var if var else float("nan")


def judge(counts: dict, m: dict[str, float], slots: list[dict], health: int, rss: dict,
          server_alive: bool, log_tracebacks: int, after_ok: bool, require_paths: bool) -> list[dict]:
    """The checks, each {name, ok, detail}."""
    held, parked, free, total, active = (chunks(m, s) for s in ("held", "parked", "free", "total", "active"))
    busy = [s["id"] for s in slots if s["state"] in BUSY_STATES]
    # Chunks shared by several conversations (a forked prefix) are in several lanes' tables but
    # held (and parked) once: count each idle lane's own chunks.
    idle_lane_chunks = sum(s["chunks_held"] - s.get("chunks_shared", 0) for s in slots if s["state"] == "idle")
    statuses = http_statuses(m)
    server_errors = {k: v for k, v in statuses.items() if k.startswith("5") and k != "503"}
    checks = [
        ("no failures", counts["failure"] == 0, f"{counts['failure']} failed (hangs: {counts['hangs']})"),
        ("server alive, /health 200", server_alive and health == 200, f"alive={server_alive} health={health}"),
        ("no lane busy", not busy, f"busy lanes {busy}" if busy else "every lane empty or idle"),
        ("nothing running or queued", m.get("strata_requests_running") == 0 and m.get("strata_requests_queued") == 0,
         f"running={m.get('strata_requests_running')} queued={m.get('strata_requests_queued')}"),
        ("every chunk free or parked", active == 0 and held == parked and free + held == total
         and idle_lane_chunks <= parked,
         f"total={total} free={free} held={held} parked={parked} active={active} "
         f"idle lanes hold {idle_lane_chunks} unshared"),
        ("no 5xx but 503", not server_errors, f"HTTP statuses {statuses}"),
        ("no traceback in the server log", log_tracebacks == 0, f"{log_tracebacks} tracebacks"),
        ("a chat request after the run", after_ok, "200 with an answer" if after_ok else "it failed"),
        ("RSS flat after warm-up", rss["ok"],
         f"median last third {rss['end_mib']:.0f} MiB vs second third {rss['warm_mib']:.0f} MiB "
         f"(limit {rss['limit_mib']:.0f})"),
    ]
    paths = {
        "refused kv_pool_full (503 + Retry-After)": counts["refused_pool"],
        "refused queue_full (503 + Retry-After)": counts["refused_queue"],
        "truncated (length + truncated: true)": counts["truncated"],
        "evictions of parked conversations": int(m.get("strata_kv_evictions_total", 0)),
    }
    for name, n in paths.items():
        checks.append((f"path fired: {name}", n > 0 or not require_paths, f"{n}"))
    return [{"name": n, "ok": bool(ok), "detail": d} for n, ok, d in checks]

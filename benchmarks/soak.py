"""Load and soak: N clients for M minutes against a real `strata serve` with a small KV pool.

The server runs in a child process on a free loopback port (the default model, bf16) with a
pool small enough that every pool-full path fires: admission refusals (503 `kv_pool_full` +
Retry-After, or an SSE error event once a stream has started), truncation mid-decode
(`finish_reason: "length"`, `truncated: true`), evictions of parked conversations, and
`queue_full` 503s (more clients than lanes + --max-waiting). The clients (see
soak_parts/clients.py) run chats with follow-ups, branches and regenerates, token-id prompts
up to near the context, random max_tokens, streams dropped mid-way, and retries after
Retry-After. Every request must end complete, truncated, refused with Retry-After, or
dropped by us; anything else (another status, a broken stream, a hang past
--request-timeout) is a failure.

After the clients stop and the engine settles: no lane busy, nothing running or queued,
every chunk free or held by a parked conversation (/metrics, /slots), /health 200, no 5xx
but 503, no traceback in the server's log, a normal chat still answered, and the server's
RSS flat after warm-up (median of the last third of the run at most --rss-tol % or
--rss-tol-mib above the second third's). With --require-paths (default) each pool-full
path must have fired; --until-paths keeps the load on past M minutes until they have.

    python benchmarks/soak.py [--clients 12] [--minutes 5] [--seed 0] [--pool-tokens 768]

Prints a table, writes benchmarks/results/soak.json (or --out) and soak.png (matplotlib,
optional); exits 1 when any check fails. `--quick`: 3 clients for 10 s, RSS and the pool-full
paths not judged (a smoke run of the script; tests/server/test_soak.py is the real minute).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import RESULTS_DIR, print_table, progress_bar
from benchmarks.serve_parts.servers import Server, free_port
from benchmarks.serve_parts.stats import pct
from benchmarks.soak_parts import checks
from benchmarks.soak_parts.clients import Load, run_clients
from benchmarks.soak_parts.exchange import OUTCOMES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=12)
    p.add_argument("--big-clients", type=int, default=None,
                   help="clients sending only near-max-context prompts (default: a third of --clients)")
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("server")
    g.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    g.add_argument("--pool-tokens", type=int, default=768,
                   help="--kv-pool-tokens (default 1.5 contexts: one near-max-context prompt and a few short ones fill it)")
    g.add_argument("--kv-chunk", type=int, default=32)
    g.add_argument("--max-context", type=int, default=512)
    g.add_argument("--batch", type=int, default=3, help="batch slots besides the main session")
    g.add_argument("--max-waiting", type=int, default=None,
                   help="default: clients - lanes - 1, at least 1 (so queue_full 503s happen)")
    g.add_argument("--prefill-chunk", type=int, default=96)
    g.add_argument("--sse-keepalive", type=float, default=2.0,
                   help="a stream waiting this long for a lane starts (later refusals are SSE events)")
    g.add_argument("--threads", type=int, default=2)
    g.add_argument("--dtype", default="bfloat16")
    c = p.add_argument_group("clients")
    c.add_argument("--disconnect", type=float, default=0.15, help="share of streams dropped mid-way")
    c.add_argument("--stream", type=float, default=0.7, help="share of requests streamed")
    c.add_argument("--longest", type=int, default=96, help="the most new tokens a request asks for")
    c.add_argument("--request-timeout", type=float, default=300.0,
                   help="a request not ended after this many seconds is a hang (a failure)")
    c.add_argument("--max-retry-wait", type=float, default=20.0,
                   help="a refusal whose Retry-After is longer is given up, not retried early")
    j = p.add_argument_group("checks")
    j.add_argument("--sample-every", type=float, default=2.0, help="seconds between RSS/pool samples")
    j.add_argument("--settle", type=float, default=60.0, help="seconds the engine may take to go quiet")
    j.add_argument("--rss-tol", type=float, default=5.0, help="%% RSS may grow from the second to the last third")
    j.add_argument("--rss-tol-mib", type=float, default=48.0, help="... or this many MiB, whichever is more")
    j.add_argument("--require-paths", action=argparse.BooleanOptionalAction, default=True,
                   help="fail unless every pool-full path fired")
    j.add_argument("--until-paths", type=float, default=0.0,
                   help="keep the load on up to this many seconds past --minutes until every path fired")
    g.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable for the server process (e.g. MALLOC_ARENA_MAX=2); repeatable")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/soak.json)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 3 clients for 10 s; the checks that need minutes (RSS flat, every "
                        "pool-full path fired) are not judged")
    args = p.parse_args(argv)
    if args.quick:
        args.clients, args.big_clients, args.minutes, args.require_paths = 3, 1, 10 / 60, False
        args.rss_tol, args.rss_tol_mib, args.until_paths = 1e6, 1e6, 0.0
    lanes = args.batch + 1
    if args.big_clients is None:
        args.big_clients = max(1, args.clients // 3)
    if args.max_waiting is None:
        args.max_waiting = max(1, args.clients - lanes - 1)
    return args


def server_cmd(args: argparse.Namespace, port: int) -> list[str]:
    cmd = [
        sys.executable, "-m", "strata.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--batch", str(args.batch), "--max-context", str(args.max_context),
        "--kv-pool-tokens", str(args.pool_tokens), "--kv-chunk", str(args.kv_chunk),
        "--prefill-chunk", str(args.prefill_chunk), "--threads", str(args.threads),
        "--dtype", args.dtype, "--max-waiting", str(args.max_waiting),
        "--sse-keepalive", str(args.sse_keepalive), "--model-alias", "smol",
    ]
    return cmd + (["--model", args.model] if args.model else [])


def counts_of(records) -> dict:
    out = collections.Counter(r.outcome for r in records)
    counts = {k: out.get(k, 0) for k in OUTCOMES}
    counts["refused_pool"] = sum(1 for r in records if r.detail.startswith("kv_pool_full"))
    counts["refused_pool_sse"] = sum(1 for r in records if r.detail == "kv_pool_full/sse")
    counts["refused_queue"] = sum(1 for r in records if r.detail == "queue_full")
    counts["hangs"] = sum(1 for r in records if r.outcome == "failure" and r.detail.startswith("hang"))
    counts["retries"] = sum(1 for r in records if r.attempt > 0)
    return counts


async def _paths_watch(load: Load, http, url: str, extra_s: float) -> None:
    """Past the deadline, keep the load on (10 s at a time, `extra_s` at most) until every path fired."""
    limit = load.deadline + extra_s
    while True:
        await asyncio.sleep(max(0.0, load.deadline - 5 - time.perf_counter()))
        c = counts_of(load.records)
        try:
            m = checks.parse_metrics((await http.get(url + "/metrics", timeout=10)).text)
            evictions = m.get("strata_kv_evictions_total", 0)
        except Exception:  # noqa: BLE001
            evictions = 0
        fired = c["refused_pool"] and c["refused_queue"] and c["truncated"] and evictions
        if fired or load.deadline + 10 > limit:
            return
        load.deadline += 10


async def _progress(load: Load, t0: float) -> None:
    """A time bar while the load runs (quiet when stderr is not a terminal); cancelled at its end."""
    with progress_bar(round(load.deadline - t0), "soak", unit="s") as bar:
        while True:
            bar.total = max(bar.total, round(load.deadline - t0))  # --until-paths extends it
            bar.n = min(round(time.perf_counter() - t0), bar.total)
            bar.set_postfix(requests=len(load.records), refresh=True)
            await asyncio.sleep(1)


async def drive(args: argparse.Namespace, server: Server) -> dict:
    import httpx

    t0 = time.perf_counter()
    load = Load(server.url, args.max_context, t0 + 60 * args.minutes, t0, args.seed,
                disconnect_p=args.disconnect, stream_p=args.stream, request_timeout_s=args.request_timeout,
                max_retry_wait_s=args.max_retry_wait, longest=args.longest)
    samples: list[dict] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=30) as http:
        sampler = asyncio.create_task(checks.sample(http, server.url, server.proc.pid, load, samples,
                                                    args.sample_every, stop))
        watch = asyncio.create_task(_paths_watch(load, http, server.url, args.until_paths)) \
            if args.until_paths > 0 else None
        bar = asyncio.create_task(_progress(load, t0))
        await run_clients(load, args.clients, args.big_clients)
        bar.cancel()
        duration = load.deadline - t0
        last_end = time.perf_counter() - t0
        m, slots, health, settle_s = await checks.settle(http, server.url, args.settle)
        stop.set()
        await sampler
        if watch is not None:
            watch.cancel()
        after = await http.post(server.url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0})
        after_ok = after.status_code == 200 and after.json()["choices"][0]["finish_reason"] in ("stop", "length")
        if (await http.get(server.url + "/health")).status_code != 200:
            health = 503  # healthy at the checks, not after the last request
    return {"load": load, "samples": samples, "duration_s": duration, "last_end_s": last_end,
            "metrics": m, "slots": slots, "health": health, "settle_s": settle_s, "after_ok": after_ok}


def summarize(records, run: dict) -> dict:
    streams = [r.ttft for r in records if r.stream and r.ttft is not None]
    plain = [r.ttft for r in records if not r.stream and r.outcome in ("complete", "truncated")]
    m = run["metrics"]
    return {
        "requests": len(records),
        "by_outcome": counts_of(records),
        "by_action": dict(collections.Counter(r.action for r in records)),
        "by_detail": dict(collections.Counter(f"{r.outcome}: {r.detail}" for r in records
                                              if r.outcome in ("complete", "truncated", "refused"))),
        "failures": [asdict(r) | {"text": None} for r in records if r.outcome == "failure"][:50],
        "ttft_stream_p50_s": pct(streams, 50), "ttft_stream_p99_s": pct(streams, 99),
        "latency_plain_p50_s": pct(plain, 50), "latency_plain_p99_s": pct(plain, 99),
        "completion_tokens": sum(max(r.completion_tokens, 0) for r in records),
        "cached_tokens": sum(max(r.cached_tokens, 0) for r in records),
        "server": {"evictions": m.get("strata_kv_evictions_total"), "refusals": m.get("strata_kv_refusals_total"),
                   "truncations": m.get("strata_kv_truncations_total"),
                   "finished": checks.labelled(m, "strata_requests_finished_total", "finish_reason"),
                   "http_statuses": checks.http_statuses(m)},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_dir = tempfile.mkdtemp(prefix="strata-soak-")
    port = free_port()
    env = dict(item.split("=", 1) for item in args.server_env) or None
    server = Server("strata", server_cmd(args, port), port, log_dir, env)
    server.start()
    print(f"server ready in {server.load_s:.1f} s: {' '.join(server.cmd[1:])}", file=sys.stderr)
    print(f"{args.clients} clients ({args.big_clients} near-max-context) for {args.minutes:g} min", file=sys.stderr)
    try:
        run = asyncio.run(drive(args, server))
        alive = server.proc.poll() is None
    finally:
        server.stop()
    log_text = open(server.log_path, errors="replace").read()
    records = run["load"].records
    summary = summarize(records, run)
    rss = checks.rss_flat(run["samples"], run["duration_s"], args.rss_tol / 100, args.rss_tol_mib)
    verdicts = checks.judge(summary["by_outcome"], run["metrics"], run["slots"], run["health"], rss, alive,
                            log_text.count("Traceback"), run["after_ok"], args.require_paths)
    c = summary["by_outcome"]
    n = max(1, len(records))
    title = (f"soak: {args.clients} clients ({args.big_clients} near-max-context) for {run['duration_s']:.0f} s; "
             f"pool {args.pool_tokens} cells in chunks of {args.kv_chunk}, {args.batch + 1} lanes, "
             f"max-context {args.max_context}, max-waiting {args.max_waiting}; seed {args.seed}")
    rows = [[k, c[k], f"{100 * c[k] / n:.1f}%"] for k in OUTCOMES]
    rows += [["  refused kv_pool_full (HTTP / SSE)", f"{c['refused_pool'] - c['refused_pool_sse']} / "
              f"{c['refused_pool_sse']}", ""], ["  refused queue_full", c["refused_queue"], ""],
             ["  retries after Retry-After", c["retries"], ""], ["  hangs", c["hangs"], ""], ["all", len(records), ""]]
    table = print_table(title, ["outcome", "requests", "share"], rows)
    s = summary["server"]
    figures = [
        ["TTFT streams p50 / p99 (s)", f"{summary['ttft_stream_p50_s']:.2f} / {summary['ttft_stream_p99_s']:.2f}"],
        ["whole answer p50 / p99 (s)", f"{summary['latency_plain_p50_s']:.2f} / {summary['latency_plain_p99_s']:.2f}"],
        ["tokens generated / prompt tokens reused", f"{summary['completion_tokens']} / {summary['cached_tokens']}"],
        ["server: evictions / refusals / truncations", f"{s['evictions']:.0f} / {s['refusals']:.0f} / {s['truncations']:.0f}"],
        ["RSS start / warm / end / max (MiB)",
         f"{rss['start_mib']:.0f} / {rss['warm_mib']:.0f} / {rss['end_mib']:.0f} / {rss['max_mib']:.0f}"],
        ["RSS trend after warm-up / over the last half (MiB/min)",
         f"{rss['slope_mib_per_min']:+.1f} / {rss['last_half_mib_per_min']:+.1f}"],
        ["last request ended / settled after (s)", f"{run['last_end_s']:.0f} / {run['settle_s']:.1f}"],
    ]
    table += "\n" + print_table("figures", ["", "value"], figures)
    table += "\n" + print_table("checks", ["check", "ok", "detail"],
                                [[v["name"], "ok" if v["ok"] else "FAIL", v["detail"]] for v in verdicts])
    for f in summary["failures"][:10]:
        print(f"failure: client {f['client']} {f['endpoint']} {f['action']} stream={f['stream']}: {f['detail']}")
    out = args.out or os.path.join(RESULTS_DIR, "soak.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    payload = {"args": vars(args), "command": server.cmd, "load_s": server.load_s, "duration_s": run["duration_s"],
               "summary": summary, "rss": rss, "checks": verdicts, "ok": all(v["ok"] for v in verdicts),
               "table": table, "samples": run["samples"], "slots_after": run["slots"],
               "records": [asdict(r) | {"text": None} for r in records]}
    import json

    with open(out, "w") as f:
        json.dump(payload, f, indent=1)
    print(f"raw numbers: {out}")
    if not args.no_plot:
        png = os.path.splitext(out)[0] + ".png"
        try:
            from benchmarks.soak_parts.plot import plot

            plot(run["samples"], run["duration_s"], png, title)
            print(f"plot: {png}")
        except ImportError:
            print("no plot: matplotlib is not installed")
    if not payload["ok"]:
        print("SOAK FAILED: " + "; ".join(v["name"] for v in verdicts if not v["ok"]))
    if "Traceback" in log_text:
        print(f"server log ({server.log_path}), last part:\n{log_text[-3000:]}")
    if payload["ok"] and "Traceback" not in log_text:
        shutil.rmtree(log_dir, ignore_errors=True)  # kept, and named, when something failed
    elif "Traceback" not in log_text:
        print(f"the server's log: {server.log_path}")
    return 0 if payload["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

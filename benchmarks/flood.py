"""A connection flood against a real `strata serve`: N concurrent streaming requests, far more
than --max-connections, each on its own connection, half on /v1/chat/completions and half on
/v1/messages; then the same flood again after a failed save (a `/slots` save into a
directory removed under the server, a named 409 `directory_missing`).

Each answer is sorted by what the client got: a 200 stream that ended ([DONE] or
`message_stop`), strata's refusal in the route's shape with Retry-After (503
`too_many_connections` / `queue_full` in OpenAI's shape, 529 `overloaded_error` in
Anthropic's), anything else (a bare or unexpected answer, a broken stream), or no answer (a
connection dropped or refused). While the flood runs, /health and /metrics are asked every
0.2 s; their statuses and slowest answer are in the table. After each flood, /health must
answer 200 and one plain chat must be served.

    python benchmarks/flood.py [--connections 200] [--max-connections 32] [--batch 3] [--max-tokens 16]

Prints a table, writes benchmarks/results/flood.json and flood.png (or under --out); exits 1
when an answer was neither served nor the documented refusal, none was served, or a probe
failed. `--quick`: 24 connections against --max-connections 4.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, print_table, pyplot, write_json  # noqa: E402
from benchmarks.serve_parts.servers import Server, free_port  # noqa: E402

OUTCOMES = ("served", "refused", "other", "no answer")
ROUTES = {
    "openai": ("/v1/chat/completions", "data: [DONE]"),
    "anthropic": ("/v1/messages", "event: message_stop"),
}
REFUSALS = {"openai": (503, "unavailable_error"), "anthropic": (529, "overloaded_error")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=200, help="concurrent streams in each flood")
    p.add_argument("--max-connections", type=int, default=32, help="the server's --max-connections")
    p.add_argument("--batch", type=int, default=3, help="the server's --batch (lanes besides the main one)")
    p.add_argument("--max-tokens", type=int, default=16, help="new tokens each request asks for")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    add_quick_and_out(p, "24 connections against --max-connections 4")
    args = p.parse_args(argv)
    if args.quick:
        args.connections, args.max_connections, args.max_tokens = 24, 4, 4
    return args


def body_for(api: str, max_tokens: int) -> dict:
    messages = [{"role": "user", "content": "Name three colours."}]
    if api == "anthropic":
        return {"model": "smol", "max_tokens": max_tokens, "messages": messages, "stream": True}
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}


def sort_answer(api: str, status: int, ctype: str, retry_after: str | None, text: str) -> tuple[str, str]:
    """(outcome, detail) of one answer (see the module doc)."""
    if status == 200:
        ended = ROUTES[api][1] in text and ctype.startswith("text/event-stream")
        return ("served", "") if ended else ("other", f"200 {ctype}: stream without its end")
    want_status, want_type = REFUSALS[api]
    try:
        error = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return "other", f"{status} {ctype}: {text[:60]!r}"
    if status == want_status and error.get("type") == want_type and retry_after and int(retry_after) >= 1:
        return "refused", error.get("code") or error.get("type")
    return "other", f"{status} {error.get('type')}/{error.get('code')} retry-after={retry_after}"


async def one(client, i: int, max_tokens: int) -> dict:
    import httpx

    api = "anthropic" if i % 2 else "openai"
    try:
        async with client.stream("POST", ROUTES[api][0], json=body_for(api, max_tokens)) as r:
            text = (await r.aread()).decode(errors="replace")
            outcome, detail = sort_answer(api, r.status_code, r.headers.get("content-type", ""),
                                          r.headers.get("retry-after"), text)
    except httpx.TransportError as exc:
        outcome, detail = "no answer", type(exc).__name__
    return {"api": api, "outcome": outcome, "detail": detail}


async def flood(url: str, n: int, max_tokens: int) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)  # a connection each
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client, \
            httpx.AsyncClient(base_url=url, timeout=60) as probe:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(one(client, i, max_tokens)) for i in range(n)]
        probes: list[tuple[int, float]] = []
        while not all(t.done() for t in tasks):
            for route in ("/health", "/metrics"):
                t = time.perf_counter()
                try:
                    status = (await probe.get(route)).status_code
                except httpx.TransportError:
                    status = 0
                probes.append((status, time.perf_counter() - t))
            await asyncio.sleep(0.2)
        answers = [t.result() for t in tasks]
        seconds = time.perf_counter() - t0
        health = (await probe.get("/health")).status_code
        after = await probe.post("/v1/chat/completions", json={**body_for("openai", 4), "stream": False})
    return {"answers": answers, "seconds": seconds, "probes": probes, "health_after": health,
            "chat_after": after.status_code}


def failed_save(url: str, slot_dir: str) -> dict:
    """A save the storage refuses: the slot directory removed under the server."""
    import httpx

    httpx.post(url + "/v1/chat/completions", timeout=300, json={**body_for("openai", 4), "stream": False})
    shutil.rmtree(slot_dir)
    r = httpx.post(url + "/slots/0", params={"action": "save"}, json={"filename": "chat.bin"}, timeout=300)
    os.makedirs(slot_dir)
    return {"status": r.status_code, "code": r.json().get("error", {}).get("code")}


def summarize(run: dict) -> dict:
    by = collections.Counter((a["api"], a["outcome"]) for a in run["answers"])
    details = collections.Counter(f"{a['api']} {a['outcome']}: {a['detail']}" for a in run["answers"] if a["detail"])
    statuses = collections.Counter(s for s, _ in run["probes"])
    return {"by_route": {api: {o: by.get((api, o), 0) for o in OUTCOMES} for api in ROUTES},
            "details": dict(details), "probe_statuses": dict(statuses),
            "probe_slowest_s": max((s for _, s in run["probes"]), default=float("nan")),
            "seconds": run["seconds"], "health_after": run["health_after"], "chat_after": run["chat_after"]}


def failures_of(s: dict) -> list[str]:
    total = collections.Counter()
    for counts in s["by_route"].values():
        total.update(counts)
    bad = []
    if total["other"] or total["no answer"]:
        bad.append(f"{total['other']} other answers, {total['no answer']} without one")
    if not total["served"]:
        bad.append("none served")
    if set(s["probe_statuses"]) != {200}:
        bad.append(f"probes answered {s['probe_statuses']}")
    if s["health_after"] != 200 or s["chat_after"] != 200:
        bad.append(f"after: /health {s['health_after']}, chat {s['chat_after']}")
    return bad


def plot(results: dict, path: str, title: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{arm}\n{api}" for arm in results for api in ROUTES]
    bottom = [0] * len(labels)
    for outcome in OUTCOMES:
        values = [results[arm]["by_route"][api][outcome] for arm in results for api in ROUTES]
        ax.bar(labels, values, bottom=bottom, label=outcome)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("requests")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = tempfile.mkdtemp(prefix="strata-flood-")
    slot_dir = os.path.join(work, "slots")
    os.makedirs(slot_dir)
    port = free_port()
    cmd = [sys.executable, "-m", "strata.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--max-connections", str(args.max_connections), "--batch", str(args.batch), "--threads",
           str(args.threads), "--dtype", "bfloat16", "--model-alias", "smol", "--slot-save-path", slot_dir]
    server = Server("strata", cmd + (["--model", args.model] if args.model else []), port, work)
    server.start()
    results, saves = {}, {}
    try:
        results["fresh"] = summarize(asyncio.run(flood(server.url, args.connections, args.max_tokens)))
        saves["after a failed save"] = failed_save(server.url, slot_dir)
        results["after a failed save"] = summarize(asyncio.run(flood(server.url, args.connections,
                                                                     args.max_tokens)))
    finally:
        server.stop()
    title = (f"flood: {args.connections} concurrent streams against strata serve --max-connections "
             f"{args.max_connections} ({args.batch + 1} lanes, {args.max_tokens} tokens each)")
    rows = [[arm, api, *(counts[o] for o in OUTCOMES)] for arm, s in results.items()
            for api, counts in s["by_route"].items()]
    print_table(title, ["flood", "route", *OUTCOMES], rows)
    print_table("during and after each flood", ["flood", "seconds", "/health and /metrics probes", "slowest ms",
                                                "/health after", "a chat after"],
                [[arm, s["seconds"], str(s["probe_statuses"]), 1e3 * s["probe_slowest_s"], s["health_after"],
                  s["chat_after"]] for arm, s in results.items()])
    for arm, save in saves.items():
        print(f"{arm}: the save answered {save['status']} {save['code']}")
    for arm, s in results.items():
        for detail, n in sorted(s["details"].items()):
            print(f"{arm}: {n} x {detail}")
    failures = {arm: failures_of(s) for arm, s in results.items()}
    path = write_json("flood.json", {"args": vars(args), "command": cmd, "results": results, "saves": saves,
                                     "failures": failures}, args.out)
    print(f"wrote {path}")
    try:
        plot(results, os.path.join(args.out, "flood.png"), title)
    except ImportError:
        print("no plot: matplotlib is not installed")
    for arm, bad in failures.items():
        for b in bad:
            print(f"FAIL {arm}: {b}")
    if any(failures.values()):
        print(f"the server's log: {server.log_path}")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

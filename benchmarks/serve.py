"""Serving under load: `strata serve` vs llama.cpp's `llama-server`, at concurrency 1, 4 and 8.

Both servers run on the same GGUF (the default model), on loopback, with 2 threads and 8
lanes: strata with `--batch 7 --max-context 1024` (8 x 1024 cells, like llama-server's
`-np 8 -c 8192`), bf16 compute and `--prefill-chunk` prompt tokens per step; llama-server
with `-np 8 -c 8192 -t 2` (continuous batching is its default). At each concurrency C,
C clients send streaming /v1/completions requests back to back: a 512-token prompt given as
token ids (random words, different for every request from the first token on, so neither
server's prompt cache makes prefill free), 128 new tokens (greedy, ignore_eos). Both arms
get exactly the same requests; the arms alternate at each concurrency level (and swap
order every other round), and only one of them is working at a time.

Per request: TTFT (send to first token), TPOT ((last token - first token) / (tokens - 1)),
and every gap between two consecutive streamed tokens. Per level: p50/p90/p99 of TTFT and
TPOT, the p99 of all gaps (ITL), each stream's largest gap (p50 and p99 over the streams:
what a prefill stall costs a stream already decoding) and the largest of all, requests/s
and output tokens/s (over the level's wall time); ratios are strata / llama.cpp. A run
during which other work on the (shared) machine took over --others-max % of the CPUs is
run again with fresh prompts. Raw records go to benchmarks/results/serve.json, the
percentiles to serve.png (matplotlib).

    python benchmarks/serve.py [--quick] [--rounds 2] [--prefill-chunk 96]
                               [--llama-server PATH] [--concurrency 1,4,8]

Build llama-server as README describes; without it the llama.cpp arm is left out.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import itertools
import json
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import RESULTS_DIR, host_busy_cpu_s, print_table, wait_for_quiet, write_json

LLAMA_SERVER_GLOB = "/tmp/llamacpp/**/build/bin/llama-server"
STARTUP_TIMEOUT_S = 180
_WORDS = (
    "river stone lantern harbor window garden quiet morning letter bridge silver thunder orchard "
    "candle market winter meadow valley forest copper engine signal island mirror pocket ladder "
    "tunnel summer feather canyon basket marble violin castle planet rocket shadow blanket "
    "compass anchor desert glacier village kettle pencil ribbon saddle temple walnut whistle "
    "yellow zebra crystal falcon harvest journey kingdom meadowlark notebook oyster pepper quilt "
    "rainbow sparrow tiger umbrella velvet wagon yarn acorn beacon cabin dolphin ember fossil "
    "granite hollow ivory jasmine kayak lemon maple nectar olive pebble quartz raven spruce "
    "tulip unicorn vessel willow timber carpet bottle circle doctor farmer hunter sailor "
    "teacher painter walks sings carries builds watches opens closes finds brings keeps leaves "
    "under over beside behind across through after before during toward slowly quickly "
    "gently quietly bright dark warm cold ancient modern hidden golden broken gentle"
)
WORDS = _WORDS.split()


# ---- the two servers --------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_llama_server() -> str | None:
    found = sorted(glob.glob(LLAMA_SERVER_GLOB, recursive=True))
    return found[0] if found else None


class Server:
    """A server in a child process on a free loopback port; ready once GET /health is 200."""

    def __init__(self, arm: str, cmd: list[str], port: int, log_dir: str):
        self.arm, self.cmd, self.port = arm, cmd, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = os.path.join(log_dir, f"{arm.replace('.', '')}.log")
        self.proc: subprocess.Popen | None = None
        self.load_s = float("nan")

    def start(self) -> None:
        import httpx

        t0 = time.perf_counter()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = t0 + STARTUP_TIMEOUT_S
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.arm} exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self.load_s = time.perf_counter() - t0
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{self.arm} did not become ready in {STARTUP_TIMEOUT_S} s:\n{self.log_tail()}")

    def cpu_s(self) -> float:
        """CPU seconds the server process has used so far (user + system, its threads included)."""
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def log_tail(self, n: int = 3000) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-n:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def strata_cmd(args, port: int) -> list[str]:
    lanes_besides_main = args.lanes - 1
    return [
        sys.executable, "-m", "strata.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--batch", str(lanes_besides_main), "--max-context", str(args.ctx_per_lane),
        "--prefill-chunk", str(args.prefill_chunk), "--threads", str(args.threads),
        "--dtype", "bfloat16", "--weights", args.weights, "--max-waiting", "64",
    ]


def llama_cmd(args, port: int, model: str) -> list[str]:
    return [
        args.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port),
        "-np", str(args.lanes), "-c", str(args.lanes * args.ctx_per_lane),
        "-t", str(args.threads), "-tb", str(args.threads),
    ]


# ---- the load ------------------------------------------------------------------------------
def make_prompts(tokenizer, count: int, length: int, seed: int) -> list[list[int]]:
    """`count` prompts of exactly `length` token ids, random words, each its own from the start."""
    rng = random.Random(seed)
    prompts = []
    while len(prompts) < count:
        text = " ".join(rng.choice(WORDS) for _ in range(length * 2)).capitalize() + "."
        ids = tokenizer.encode(text)[:length]
        if len(ids) == length and all(ids[0] != p[0] for p in prompts[-16:]):
            prompts.append(ids)
    return prompts


@dataclass
class Record:
    """One request as its client saw it (seconds on the benchmark's perf_counter clock)."""

    client: int
    sent: float
    token_times: list[float] = field(default_factory=list)  # a streamed event with text
    prompt_tokens: int = -1
    completion_tokens: int = -1
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.sent

    @property
    def tpot(self) -> float:
        n = max(self.completion_tokens, len(self.token_times))
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else float("nan")

    @property
    def gaps(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]


async def one_request(client, url: str, prompt: list[int], new: int, rec: Record) -> None:
    body = {
        "prompt": prompt, "max_tokens": new, "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    }
    rec.sent = time.perf_counter()
    # A fresh connection each time: a kept-alive one the server has just closed would fail the
    # request (llama-server closes idle ones); a loopback connect costs well under a millisecond.
    headers = {"Connection": "close"}
    async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            rec.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
            return
        async for line in r.aiter_lines():
            now = time.perf_counter()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                rec.error = str(event["error"])[:300]
                return
            if event.get("choices") and event["choices"][0].get("text"):
                rec.token_times.append(now)
            if event.get("usage"):
                rec.prompt_tokens = event["usage"]["prompt_tokens"]
                rec.completion_tokens = event["usage"]["completion_tokens"]


async def run_level(url: str, prompts: list[list[int]], concurrency: int, new: int) -> dict:
    """`concurrency` clients take the prompts in order, each sending its next as soon as one ends."""
    import httpx

    queue: asyncio.Queue = asyncio.Queue()
    for p in prompts:
        queue.put_nowait(p)
    records: list[Record] = []
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)

    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:

        async def worker(i: int) -> None:
            while not queue.empty():
                prompt = queue.get_nowait()
                rec = Record(client=i, sent=time.perf_counter())
                records.append(rec)
                try:
                    await one_request(client, url, prompt, new, rec)
                except httpx.HTTPError as exc:
                    rec.error = f"{type(exc).__name__}: {exc}"

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"t0": t0, "wall_s": wall, "records": records}


def measured(servers: dict[str, Server], arm: str, level) -> dict:
    """Runs the `level` coroutine, adding what the CPUs did meanwhile: the idle peer server's CPU seconds,
    and the share of all CPUs used by anything but the two servers and this process."""
    import psutil

    me = psutil.Process()
    peers = [s for a, s in servers.items() if a != arm]
    host0, own0 = host_busy_cpu_s(), sum(s.cpu_s() for s in servers.values()) + sum(me.cpu_times()[:2])
    peer0 = sum(s.cpu_s() for s in peers)
    run = asyncio.run(level)
    host1, own1 = host_busy_cpu_s(), sum(s.cpu_s() for s in servers.values()) + sum(me.cpu_times()[:2])
    run["peer_cpu_s"] = sum(s.cpu_s() for s in peers) - peer0
    others = max(0.0, (host1 - host0) - (own1 - own0))
    run["others_cpu_share"] = others / (run["wall_s"] * (psutil.cpu_count() or 1))
    return run


# ---- numbers -------------------------------------------------------------------------------
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


# ---- table and plot ---------------------------------------------------------------------
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
        if "llama.cpp" in arms:
            a, b = summary["strata"][str(c)], summary["llama.cpp"][str(c)]
            rows.append([c, "strata / llama.cpp"]
                        + [a[k] / b[k] if b[k] else float("nan") for k, _ in COLUMNS] + ["", ""])
    return rows


def plot(summary: dict, arms: list[str], levels: list[int], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("TTFT (s)", [("ttft_p50_s", "p50"), ("ttft_p90_s", "p90"), ("ttft_p99_s", "p99")]),
        ("time per output token (ms)", [("tpot_p50_ms", "p50"), ("tpot_p90_ms", "p90"), ("tpot_p99_ms", "p99")]),
        ("gap between tokens (ms)", [("itl_p50_ms", "all gaps p50"), ("itl_p99_ms", "all gaps p99"),
                                     ("stream_gap_p99_ms", "stream's largest p99")]),
        ("output tokens/s (all streams)", [("out_tok_s", "")]),
    ]
    colors = {"strata": "tab:blue", "llama.cpp": "tab:orange"}
    styles = ["-", "--", ":"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    for ax, (name, series) in zip(axes.flat, panels):
        for arm in arms:
            for (key, label), style in zip(series, styles):
                ys = [summary[arm][str(c)][key] for c in levels]
                ax.plot(levels, ys, style, marker="o", color=colors.get(arm),
                        label=f"{arm} {label}".strip())
        ax.set_title(name)
        ax.set_xlabel("concurrent clients")
        ax.set_xticks(levels)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes.flat[2].set_yscale("log")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- main ----------------------------------------------------------------------------------
def requests_at(c: int, args) -> int:
    if args.requests is not None:
        return max(args.requests, c)
    return c if args.quick else max(12, 3 * c)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one request per client (a smoke run)")
    p.add_argument("--concurrency", default="1,4,8", help="comma-separated client counts")
    p.add_argument("--requests", type=int, default=None,
                   help="requests per level and round (default max(12, 3 x clients); --quick: one per client)")
    p.add_argument("--rounds", type=int, default=None,
                   help="arms alternate, order swapped each round (default 2; --quick: 1)")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--ctx-per-lane", type=int, default=1024)
    p.add_argument("--prefill-chunk", type=int, default=96,
                   help="strata's --prefill-chunk (96: a step with a prompt piece stays under ~200 ms at 8 lanes)")
    p.add_argument("--weights", default="auto", help="strata's --weights")
    p.add_argument("--llama-server", default=find_llama_server(),
                   help="llama.cpp's llama-server binary (default: a build under /tmp/llamacpp)")
    p.add_argument("--no-llama", action="store_true", help="leave the llama.cpp arm out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet-wait", type=float, default=None,
                   help="seconds to wait before each run for the CPUs to be mostly idle (default 300; --quick 30)")
    p.add_argument("--quiet-cpu", type=float, default=25.0, help="host CPU %% counted as mostly idle")
    p.add_argument("--others-max", type=float, default=10.0,
                   help="a run during which other work used more than this %% of the CPUs is run again")
    p.add_argument("--max-redo", type=int, default=None, help="runs again at most (default 3; --quick 1)")
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    if args.max_redo is None:
        args.max_redo = 1 if args.quick else 3
    if args.quiet_wait is None:
        args.quiet_wait = 30 if args.quick else 300
    if max(levels) > args.lanes:
        p.error(f"--concurrency {max(levels)} is more than --lanes {args.lanes}")

    from strata.loader import open_model
    from strata.loader.default import default_model_path

    model = default_model_path()
    tokenizer = open_model(model).tokenizer
    arms = ["strata"]
    notes = []
    if args.no_llama:
        notes.append("llama.cpp: left out (--no-llama)")
    elif args.llama_server and os.access(args.llama_server, os.X_OK):
        arms.append("llama.cpp")
    else:
        notes.append(f"llama.cpp: no llama-server binary ({args.llama_server or LLAMA_SERVER_GLOB}); arm left out")
    for n in notes:
        print(n, file=sys.stderr)

    code = code_version()
    log_dir = tempfile.mkdtemp(prefix="strata-serve-bench-")
    servers: dict[str, Server] = {}
    port = free_port()
    servers["strata"] = Server("strata", strata_cmd(args, port), port, log_dir)
    if "llama.cpp" in arms:
        port = free_port()
        servers["llama.cpp"] = Server("llama.cpp", llama_cmd(args, port, model), port, log_dir)
    # Each level's prompts, per round; the same list goes to both arms.
    count = {c: requests_at(c, args) for c in levels}
    prompts: dict[tuple[int, int], list[list[int]]] = {}
    all_prompts = make_prompts(tokenizer, 1 + args.rounds * sum(count.values()), args.prompt, args.seed)
    warm = all_prompts[0]
    base = 1
    for r in range(args.rounds):
        for c in levels:
            prompts[(r, c)] = all_prompts[base : base + count[c]]
            base += count[c]

    raw: dict[str, dict[str, list[dict]]] = {a: {str(c): [] for c in levels} for a in arms}
    discarded: list[dict] = []
    started = time.time()
    try:
        for arm in arms:
            servers[arm].start()
            print(f"{arm}: ready in {servers[arm].load_s:.1f} s ({' '.join(servers[arm].cmd)})", file=sys.stderr)
            asyncio.run(run_level(servers[arm].url, [warm], 1, 8))  # warm-up: one short request
        for r in range(args.rounds):
            for c in levels:
                order = arms if r % 2 == 0 else arms[::-1]
                for arm in order:
                    for attempt in range(1 + args.max_redo):
                        # A redo gets fresh prompts: the first try's are in both servers' caches now.
                        batch = prompts[(r, c)] if attempt == 0 else make_prompts(
                            tokenizer, count[c], args.prompt, args.seed + 1000 + len(discarded))
                        quiet = wait_for_quiet(args.quiet_wait, args.quiet_cpu)
                        run = measured(servers, arm, run_level(servers[arm].url, batch, c, args.new))
                        run["machine_at_start"], run["attempt"] = quiet, attempt
                        others = 100 * run["others_cpu_share"]
                        ok = [x for x in run["records"] if x.error is None]
                        print(f"  round {r + 1}/{args.rounds} c={c} {arm}: {len(ok)}/{len(run['records'])} ok "
                              f"in {run['wall_s']:.0f} s; other work {others:.0f}% of the CPUs "
                              f"(at start {quiet['cpu_busy_percent']:.0f}% busy)", file=sys.stderr)
                        if others <= args.others_max or attempt == args.max_redo:
                            break
                        print(f"    other work over {args.others_max:.0f}%: run again", file=sys.stderr)
                        discarded.append({"arm": arm, "c": c, "round": r, **_run_json(run)})
                    raw[arm][str(c)].append(run)
    finally:
        for s in servers.values():
            s.stop()

    summary = {a: {str(c): summarize(raw[a][str(c)], args.new) for c in levels} for a in arms}
    load = os.getloadavg()
    title = (f"serve benchmark: {args.prompt}-token prompts, {args.new} new tokens, streaming /v1/completions, "
             f"{args.threads} threads, {args.lanes} lanes; strata bf16 --prefill-chunk {args.prefill_chunk}; "
             f"{args.rounds} round(s), {', '.join(f'{count[c]} requests at c={c}' for c in levels)}")
    rows = table_rows(summary, arms, levels)
    table = print_table(title, ["c", "arm"] + [name for _, name in COLUMNS] + ["stalls in prefill", "other work"], rows)
    for c in levels:
        for arm in arms:
            s = summary[arm][str(c)]
            for key in ("note", "first_error"):
                if key in s:
                    print(f"c={c} {arm}: {key}: {s[key]}")
    print("ITL: every gap between two streamed tokens; max gap: each stream's largest gap (p50/p99 over "
          "the streams, and the largest of all)")
    print("stalls in prefill: gaps over 2x the median gap that overlap another request's prefill / all such gaps")
    print("other work: the largest share of the CPUs that anything but the two servers and this script used "
          "during one of that row's runs (a shared machine; over ~10% the row is slowed by it)")
    print(f"strata at {code}; load average after the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for n in notes:
        print(n)

    suffix = "-quick" if args.quick else ""
    payload = {
        "args": vars(args), "model": model, "notes": notes, "started": started, "code": code,
        "load_average_after": load,
        "commands": {a: s.cmd for a, s in servers.items()},
        "load_s": {a: s.load_s for a, s in servers.items()},
        "summary": summary, "table": table,
        "raw": {a: {c: [_run_json(run) for run in runs] for c, runs in per.items()} for a, per in raw.items()},
        "discarded": discarded,
    }
    path = write_json(f"serve{suffix}.json", payload)
    png = os.path.join(RESULTS_DIR, f"serve{suffix}.png")
    try:
        plot(summary, arms, levels, png, title.replace("; strata", ";\nstrata", 1))
        print(f"raw numbers: {path}\nplot: {png}")
    except ImportError:
        print(f"raw numbers: {path}\nno plot: matplotlib is not installed")


def code_version() -> str:
    """The commit strata's server runs, and whether strata/ had uncommitted changes then."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "strata"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+uncommitted" if dirty else "")


def _run_json(run: dict) -> dict:
    out = {k: v for k, v in run.items() if k not in ("records", "t0")}
    out["records"] = [_record_json(x, run["t0"]) for x in run["records"]]
    return out


def _record_json(rec: Record, t0: float) -> dict:
    d = asdict(rec)
    d["sent"] = round(rec.sent - t0, 6)
    d["token_times"] = [round(t - t0, 6) for t in rec.token_times]
    return d


if __name__ == "__main__":
    main()

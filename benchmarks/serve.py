"""Serving under load: `strata serve` vs llama.cpp's `llama-server` and vLLM, at concurrency 1, 4 and 8.

The servers run on the same weights (the default model), on loopback, with 2 threads and 8
lanes: strata with `--batch 7 --max-context 1024` (8 x 1024 cells, like llama-server's
`-np 8 -c 8192`), bf16 compute and `--prefill-chunk` prompt tokens per step; llama-server
with `-np 8 -c 8192 -t 2` (continuous batching is its default) as it starts by default
(arm `llama.cpp`), and tuned like strata (arm `llama.cpp-tuned`: `-b`/`-ub` equal to
strata's `--prefill-chunk`, so it reads prompts in the same pieces); vLLM's CPU backend
(arm `vllm`, `--max-num-seqs 8 --max-model-len 1024`, on a bf16 safetensors copy of the
same weights) where `--vllm-python` imports `vllm`. At each concurrency C,
C clients send streaming /v1/completions requests back to back: a 512-token prompt given as
token ids (random words, different for every request from the first token on, so neither
server's prompt cache makes prefill free), 128 new tokens (greedy, ignore_eos). All arms
get exactly the same requests; the arms alternate at each concurrency level (and reverse
order every other round), and only one of them is working at a time.

Per request: TTFT (send to first token), TPOT ((last token - first token) / (tokens - 1)),
and every gap between two consecutive streamed tokens. Per level: p50/p90/p99 of TTFT and
TPOT, the p99 of all gaps (ITL), each stream's largest gap (p50 and p99 over the streams:
what a prefill stall costs a stream already decoding) and the largest of all, requests/s
and output tokens/s (over the level's wall time); ratios are strata / each peer. A run
during which other work on the (shared) machine took over --others-max % of the CPUs is
run again with fresh prompts. Raw records go to benchmarks/results/serve.json, the
percentiles to serve.png (matplotlib).

    python benchmarks/serve.py [--quick] [--rounds 2] [--prefill-chunk N]
                               [--llama-server PATH] [--vllm-python PATH] [--concurrency 1,4,8]

Build llama-server as README describes; without it both llama.cpp arms are left out, and
without an interpreter that imports vllm (../shared/peers/vllm-cpu.md) the vLLM arm is,
each with a note in the output.

This file parses the arguments, runs the levels and writes the results; the servers, the
streaming clients, the numbers and the plot live in benchmarks/serve_parts/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import RESULTS_DIR, print_table, progress_bar, wait_for_quiet, write_json
from benchmarks.serve_parts.client import Record, make_prompts, measured, run_level
from benchmarks.serve_parts.plot import plot
from benchmarks.serve_parts.servers import Server, choose_arms, find_llama_server, make_servers
from benchmarks.serve_parts.stats import COLUMNS, summarize, table_rows


def requests_at(c: int, args) -> int:
    if args.requests is not None:
        return max(args.requests, c)
    return c if args.quick else max(12, 3 * c)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: strata alone (the peers run in full runs only), 1 and 2 clients, one "
                        "request each, 64-token prompts, 8 new tokens")
    p.add_argument("--out", default=RESULTS_DIR, help=f"directory for serve.json and serve.png (default {RESULTS_DIR})")
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
    from strata.server.cli import serve_default_prefill_chunk

    p.add_argument("--prefill-chunk", type=int, default=serve_default_prefill_chunk(),
                   help="strata's --prefill-chunk (default: `strata serve`'s on this CPU, 48, or 96 with AMX: a step "
                        "with a prompt piece stays under 100 ms at 8 lanes)")
    p.add_argument("--weights", default="auto", help="strata's --weights")
    p.add_argument("--llama-server", default=find_llama_server(),
                   help="llama.cpp's llama-server binary (default: a build under /tmp/llamacpp, else on PATH)")
    p.add_argument("--no-llama", action="store_true", help="leave both llama.cpp arms out")
    p.add_argument("--vllm-python", default=sys.executable,
                   help="an interpreter that imports vllm (its own venv); the vLLM arm runs only where it does")
    p.add_argument("--no-vllm", action="store_true", help="leave the vLLM arm out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet-wait", type=float, default=None,
                   help="seconds to wait before each run for the CPUs to be mostly idle (default 300; --quick 0)")
    p.add_argument("--quiet-cpu", type=float, default=25.0, help="host CPU %% counted as mostly idle")
    p.add_argument("--others-max", type=float, default=10.0,
                   help="a run during which other work used more than this %% of the CPUs is run again")
    p.add_argument("--max-redo", type=int, default=None, help="runs again at most (default 3; --quick 0)")
    args = p.parse_args()
    if args.quick:
        args.concurrency, args.prompt, args.new, args.lanes, args.ctx_per_lane = "1,2", 64, 8, 2, 256
        args.no_llama = args.no_vllm = True
        args.quiet_wait = 0.0 if args.quiet_wait is None else args.quiet_wait
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    if args.max_redo is None:
        args.max_redo = 0 if args.quick else 3
    if args.quiet_wait is None:
        args.quiet_wait = 30 if args.quick else 300
    if max(levels) > args.lanes:
        p.error(f"--concurrency {max(levels)} is more than --lanes {args.lanes}")

    from strata.loader import open_model
    from strata.loader.default import default_model_path

    model = default_model_path()
    tokenizer = open_model(model).tokenizer
    arms, notes = choose_arms(args)
    if args.quick:
        notes.insert(0, "--quick: strata's arm only; llama.cpp and vLLM are measured in full runs")
    for n in notes:
        print(n, file=sys.stderr)

    code = code_version()
    log_dir = tempfile.mkdtemp(prefix="strata-serve-bench-")
    servers: dict[str, Server] = make_servers(args, arms, model, log_dir, os.path.join(RESULTS_DIR, "vllm-model"))
    # Each level's prompts, per round; the same list goes to every arm.
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
        bar = progress_bar(args.rounds * len(levels) * len(arms), "rounds x levels x arms")
        for r in range(args.rounds):
            for c in levels:
                order = arms if r % 2 == 0 else arms[::-1]
                for arm in order:
                    for attempt in range(1 + args.max_redo):
                        # A redo gets fresh prompts: the first try's are in the servers' caches now.
                        batch = prompts[(r, c)] if attempt == 0 else make_prompts(
                            tokenizer, count[c], args.prompt, args.seed + 1000 + len(discarded))
                        quiet = wait_for_quiet(args.quiet_wait, args.quiet_cpu)
                        run = measured(servers, arm, run_level(servers[arm].url, batch, c, args.new))
                        run["machine_at_start"], run["attempt"] = quiet, attempt
                        others = 100 * run["others_cpu_share"]
                        ok = [x for x in run["records"] if x.error is None]
                        bar.write(f"  round {r + 1}/{args.rounds} c={c} {arm}: {len(ok)}/{len(run['records'])} ok "
                                  f"in {run['wall_s']:.0f} s; other work {others:.0f}% of the CPUs "
                                  f"(at start {quiet['cpu_busy_percent']:.0f}% busy)", file=sys.stderr)
                        if others <= args.others_max or attempt == args.max_redo:
                            break
                        bar.write(f"    other work over {args.others_max:.0f}%: run again", file=sys.stderr)
                        discarded.append({"arm": arm, "c": c, "round": r, **_run_json(run)})
                    raw[arm][str(c)].append(run)
                    bar.update(1)
        bar.close()
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
    if any("first_error" in summary[a][str(c)] for a in arms for c in levels):
        print(f"the servers' logs: {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    print("ITL: every gap between two streamed tokens; max gap: each stream's largest gap (p50/p99 over "
          "the streams, and the largest of all)")
    print("stalls in prefill: gaps over 2x the median gap that overlap another request's prefill / all such gaps")
    print("other work: the largest share of the CPUs that anything but the servers and this script used "
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
    path = write_json(f"serve{suffix}.json", payload, args.out)
    png = os.path.join(args.out, f"serve{suffix}.png")
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

"""`strata cluster` routing: follow-up TTFT, cache hits and throughput of multi-turn chat
through the front door, for three routers over the same strata replicas.

Arms (each a fresh Serve application of `--replicas` strata replicas, `--threads` each):
- round_robin: StrataRouter's baseline, replicas in turn;
- ray_prefix: Ray Serve's own PrefixCacheAffinityRouter (ray.serve.llm; text prefix tree
  of what it routed, defaults as shipped), strata/cluster/ray_prefix.py;
- strata: StrataRouter (prefix keys the replicas report, free cells, power of two; a turn
  sent away from its prefix's holder pulls the K/V over: a migration).
Workloads (cluster_parts/workload.py): `--conversations` chats of `--turns` turns, sent by
`--clients` clients (a replica has 4 lanes: --batch 3, `strata serve`'s default), with one
system prompt shared by all ("shared") or one each ("distinct"). Replies are greedy, `--new` tokens (ignore_eos). Follow-up turns (2..) give
TTFT (first content chunk) p50/p99 and the cache hit ratio (cached_tokens / prompt_tokens);
all turns give output tok/s; migrations are counted from x-strata-migrated-tokens and from
the front door's strata_cluster_migrations_total. Per round and workload the arms run back
to back, their order rotating; `/ rr` ratios pair each arm with round robin's run of the
same round. A shared machine: absolute times are noise, ratios count.

    python benchmarks/cluster.py [--rounds 2] [--conversations 12] [--turns 4] [--clients 3] [--quick]

Writes benchmarks/results/cluster.json and cluster.png (or under --out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import RESULTS_DIR, wait_for_quiet  # noqa: E402
from benchmarks.cluster_parts.summary import run_summary, workload_summary  # noqa: E402
from benchmarks.cluster_parts.tables import table  # noqa: E402
from benchmarks.cluster_parts.workload import WORKLOADS, conversations, schedule  # noqa: E402

ARMS = ("round_robin", "ray_prefix", "strata")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--workloads", default=None, help=f"default {','.join(WORKLOADS)}; --quick: shared")
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--clients", type=int, default=6, help="concurrent clients (a replica has 4 lanes)")
    ap.add_argument("--new", type=int, default=32, help="tokens per reply (greedy, ignore_eos)")
    ap.add_argument("--system-words", type=int, default=160,
                    help="random words in a system prompt (~1.1 tokens each)")
    ap.add_argument("--user-words", type=int, default=24, help="random words per user message")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    ap.add_argument("--pool", type=int, default=4096, help="--kv-pool-tokens per replica")
    ap.add_argument("--kv-chunk", type=int, default=64)
    ap.add_argument("--max-context", type=int, default=2048)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--port", type=int, default=8391, help="Serve's HTTP port (the front door)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=RESULTS_DIR, help="directory for cluster.json and cluster.png")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: round robin and strata's router, 1 round, shared workload, 4 conversations x 2 "
                         "turns, 2 clients, 4 tokens, small pools (Ray's prefix router: full runs)")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.conversations, a.turns, a.new, a.clients = 1, 4, 2, 4, 2
        a.system_words, a.user_words, a.pool, a.max_context = 40, 8, 1024, 512
        if a.arms == ",".join(ARMS):
            a.arms = "round_robin,strata"
    a.workloads = a.workloads or ("shared" if a.quick else ",".join(WORKLOADS))
    a.arm_list = [x.strip() for x in a.arms.split(",") if x.strip()]
    a.workload_list = [x.strip() for x in a.workloads.split(",") if x.strip()]
    if bad := [x for x in a.arm_list if x not in ARMS] + [x for x in a.workload_list if x not in WORKLOADS]:
        ap.error(f"unknown arms or workloads: {bad}")
    return a


def ray_prefix_note() -> str | None:
    """Why Ray's PrefixCacheAffinityRouter cannot run here, or None when it can."""
    try:
        import strata.cluster.ray_prefix  # noqa: F401 - imports Ray's router
    except ImportError as exc:
        return f"ray_prefix arm dropped: Ray's PrefixCacheAffinityRouter does not import here ({exc})"
    return None


def run_arm(cluster, arm: str, workload: str, a: argparse.Namespace) -> dict:
    from benchmarks.cluster_parts.client import run_conversations, warm
    from benchmarks.cluster_parts.deploy import cluster_spec

    deploy_s = cluster.deploy(cluster_spec(arm, a))
    try:
        ids = cluster.replica_ids()
        asyncio.run(warm(cluster.url, ids))
        convs = conversations(workload, a.conversations, a.turns, a.system_words, a.user_words, a.seed)
        run = asyncio.run(run_conversations(cluster.url, convs, schedule(a.conversations, a.turns, a.seed),
                                            a.clients, a.new))
    finally:
        cluster.remove()
    out = run_summary(run)
    out.update(arm=arm, workload=workload, deploy_s=deploy_s, replicas=ids, loadavg_1m=os.getloadavg()[0])
    return out


def main() -> int:
    a = parse_args()
    from benchmarks.cluster_parts.deploy import Cluster

    notes = []
    if "ray_prefix" in a.arm_list and (note := ray_prefix_note()):
        a.arm_list.remove("ray_prefix")
        notes.append(note)
        print(note)
    quiet = wait_for_quiet(0 if a.quick else 60)
    t0 = time.perf_counter()
    cluster = Cluster(a.port, num_cpus=2 * a.replicas + 2)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Ray's driver logging shows every request
    raw: dict[str, dict[str, list[dict]]] = {w: {arm: [] for arm in a.arm_list} for w in a.workload_list}
    try:
        for r in range(a.rounds):
            for wi, w in enumerate(a.workload_list):
                k = (r + wi) % len(a.arm_list)
                for arm in a.arm_list[k:] + a.arm_list[:k]:
                    t = time.perf_counter()
                    res = run_arm(cluster, arm, w, a)
                    raw[w][arm].append(res)
                    print(f"  round {r + 1}/{a.rounds} {w} {arm}: {time.perf_counter() - t:.0f} s (deploy "
                          f"{res['deploy_s']:.0f} s), follow-up TTFT p50 {res['ttft_p50_ms']:.0f} ms, hits "
                          f"{res['hit_ratio']:.2f}, {res['out_tok_s']:.1f} tok/s, {res['migrations']} migrations, "
                          f"{res['errors']} errors, loadavg {res['loadavg_1m']:.1f}", file=sys.stderr, flush=True)
    finally:
        cluster.close()
    elapsed = time.perf_counter() - t0
    summaries = {w: workload_summary(raw[w]) for w in a.workload_list}
    header = (f"{a.replicas} replicas x {a.threads} thread(s), default model {a.dtype}, --kv-chunk {a.kv_chunk}, "
              f"--kv-pool-tokens {a.pool}; {a.conversations} conversations x {a.turns} turns, "
              f"{a.clients} clients, "
              f"{a.new} tokens per reply, {a.rounds} round(s)")
    text = table(summaries, header)
    for note in notes:
        print(note)
    print(f"total {elapsed:.0f} s")
    os.makedirs(a.out, exist_ok=True)
    json_path, png_path = os.path.join(a.out, "cluster.json"), os.path.join(a.out, "cluster.png")
    with open(json_path, "w") as f:
        json.dump({"args": vars(a), "quiet": quiet, "notes": notes, "summary": summaries, "table": text,
                   "raw": raw, "elapsed_s": elapsed}, f, indent=1)
    try:
        from benchmarks.cluster_parts.plot import plot

        plot(summaries, f"strata cluster routing: {header}", png_path)
    except ImportError as exc:
        png_path = f"(no plot: {exc})"
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

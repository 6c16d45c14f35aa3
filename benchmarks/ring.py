"""The resident K/V ring (issue 8): decode tok/s and bytes streamed per token at three depth
tiers, for a fixed default ring, a fixed cap and the adaptive rule, plus no ring at all.

Tiers are the seed thread's (1K, 32K, 128K; default ring 32768, cap 49152) divided by
`--scale` (default 8: 128 / 4096 / 16384 cells, ring 4096, cap 6144): shallow is well under
the default ring, middle is the default ring (its context runs just past it), deep is well
past the cap. Long contexts are SYNTHETIC K/V written straight into the pool through the
conversation's chunk table (pool_parts/synthetic.py); past the model's trained length 8192
the text is meaningless and only speed is measured. Each round extends the conversation by
a short real turn (prefilled for real) and decodes `--new` tokens greedily.

Arms, each its own engine, all held in one process and stepped alternately, `--rounds`
rounds, arm order rotating per round; per round 1 / median decode step, then medians over
rounds, and ratios as medians of per-round paired ratios:
- no-ring: no `--kv-resident` (the pool read in place: what the ring itself costs);
- default: kv_resident = default ring, adapt off (the seed's control);
- cap: kv_resident = cap, adapt off;
- adaptive: kv_resident = cap, adapt on, kv_ring_default = default ring.
Extra tables: `--pages` at the deep tier (adaptive arm), and `--evict` clock vs lrfu with
three parked conversations of the middle tier taking turns in one lane (cap arm). On the CPU
also each ring arm's cost a step over no ring against its streamed bytes copied alone in the
same run (ring_parts/bytes_cost.py): the deep tiers should cost no more than their bytes.

"same tokens" compares each arm's greedy tokens with the reference arm's. On synthetic bf16
K/V (random values, near-tied logits) a different read order (runs merged by log-sum-exp,
another kernel) rounds differently and can flip a token: "no" there is rounding, not a
wrong read (checked while writing this: with a real 600-token prompt in bf16, and with the
same synthetic K/V in float32, rings of 4096 and of 64 cells in 16-cell pages decode the
no-ring tokens exactly). Exactness is the ring tests' job.

Without an accelerator the ring's arena and staging are host buffers: its copies cost memory
bandwidth, not a bus transfer, and on CPU the no-ring arm shows what they cost. For a CUDA
machine: benchmarks/ring_cuda.sh (`--device cuda`).

    python benchmarks/ring.py [--scale 8] [--rounds 5] [--new 32] [--pages 64,256,1024] [--quick]

Writes benchmarks/results/ring.json and ring.png (or under --out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import RESULTS_DIR, available_mib, wait_for_quiet  # noqa: E402
from benchmarks.ring_parts import TRAINED_LENGTH, TURN_CELLS  # noqa: E402
from benchmarks.ring_parts.bytes_cost import bytes_cost, bytes_table  # noqa: E402
from benchmarks.ring_parts.geometry import ARMS, Geometry  # noqa: E402
from benchmarks.ring_parts.interleave import run_interleaved  # noqa: E402
from benchmarks.ring_parts.plot import plot  # noqa: E402
from benchmarks.ring_parts.summary import judge_rule, summarise  # noqa: E402
from benchmarks.ring_parts.tables import ratio_table, rule_text, sweep_table, tier_table  # noqa: E402

LAYERS = 30  # SmolLM2-135M
BYTES_PER_CELL = LAYERS * 2 * 3 * 64 * 2  # bf16: 22.5 KiB (all layers)
PAIRS = [("adaptive", "default"), ("adaptive", "cap"), ("adaptive", "no-ring"), ("cap", "default"),
         ("default", "no-ring")]


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=8, help="divides tiers, default ring and cap (1: the seed's sizes)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=32, help="decoded tokens per arm per round")
    ap.add_argument("--page", type=int, default=None, help="--kv-page of the main arms (default: the engine's)")
    ap.add_argument("--pages", default="64,256,1024", help="page sweep at the deep tier; empty: skip")
    ap.add_argument("--evict", default="clock,lrfu", help="eviction policies compared; empty: skip")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (every layer on it; the pool in host memory)")
    ap.add_argument("--noise", type=float, default=0.02, help="band within which a tok/s ratio is a tie")
    ap.add_argument("--out", default=RESULTS_DIR, help="directory for ring.json and ring.png")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 4 tokens, 1 round, scale 32 (unless --scale), pages of 64, no page sweep")
    a = ap.parse_args()
    if a.quick:
        a.new, a.rounds, a.pages = 4, 1, ""
        a.scale = 32 if a.scale == 8 else a.scale
        a.page = a.page or 64  # whole pages of the scaled default ring and cap
    return a


def shared_fields(a: argparse.Namespace, max_context: int, pool_tokens: int | None = None) -> dict:
    return {"max_context": max_context, "threads": a.threads, "devices": (a.device,), "kv_pool_tokens": pool_tokens}


def check_memory(label: str, engines: int, context: int, arena_cells: int) -> None:
    need = engines * (context + arena_cells) * BYTES_PER_CELL / 2**20 + engines * 350 + 1024
    have = available_mib()
    print(f"  {label}: {engines} engines, about {need / 1024:.1f} GiB of host memory ({have / 1024:.1f} available)",
          file=sys.stderr)
    if need > have:
        raise SystemExit(f"{label} needs about {need / 1024:.1f} GiB, {have / 1024:.1f} GiB available: raise --scale")


def main() -> int:
    a = parse_args()
    from strata.kv.ring_rule import DEFAULT_PAGE

    g = Geometry(a.scale, a.page or DEFAULT_PAGE)
    g.check_page(g.page)
    growth = a.rounds * (TURN_CELLS + a.new + 1) + a.new
    g.check_tiers(growth)
    pages = [int(x) for x in a.pages.split(",") if x.strip()]
    policies = [x.strip() for x in a.evict.split(",") if x.strip()]
    for p in pages:
        g.check_page(p)
    print(g.describe())
    if g.tiers["deep"] + growth > TRAINED_LENGTH:
        print(f"WARNING: contexts up to {g.tiers['deep'] + growth} cells are beyond the model's trained length "
              f"{TRAINED_LENGTH}: SYNTHETIC K/V, speed only, the text is meaningless")
    quiet = wait_for_quiet(0 if a.quick else 60)
    header = (f"{a.new} new tokens per round, {a.rounds} round(s), arms interleaved step by step; device {a.device}, "
              f"{a.threads} thread(s); absolute times on a shared machine are noise, ratios count")
    payload = {"geometry": {"scale": g.scale, "tiers": g.tiers, "default_ring": g.default_ring, "cap": g.cap,
                            "page": g.page, "chunk": g.chunk},
               "args": vars(a), "quiet": quiet, "tiers": {}, "raw": {}, "tables": {}}
    t0 = time.perf_counter()
    for tier, cells in g.tiers.items():
        ctx = cells + growth + TURN_CELLS
        check_memory(tier, len(ARMS), ctx, g.cap)
        raw = run_interleaved(tier, {arm: g.arm_config(arm) for arm in ARMS}, shared_fields(a, ctx), cells, a.new,
                              a.rounds)
        payload["raw"][tier] = raw
        payload["tiers"][tier] = summarise(raw, "no-ring", PAIRS)
        payload["tables"][tier] = tier_table(tier, cells, payload["tiers"][tier], header)
    ratio_names = [f"{x}/{y}" for x, y in PAIRS]
    payload["tables"]["ratios"] = ratio_table(payload["tiers"], ratio_names, g.describe())
    payload["rule"] = judge_rule(payload["tiers"], a.noise, a.rounds)
    payload["tables"]["rule"] = rule_text(payload["rule"])
    if a.device == "cpu":  # on an accelerator the bytes cross a bus: ring_cuda.sh
        payload["bytes_cost"] = bytes_cost(payload["raw"], payload["tiers"], LAYERS, a.threads)
        payload["tables"]["bytes_cost"] = bytes_table(payload["bytes_cost"], header)
    if pages:
        deep = g.tiers["deep"]
        ctx = deep + growth + TURN_CELLS
        check_memory("page sweep", len(pages), ctx, g.cap)
        arms = {f"page {p}": g.arm_config("adaptive", page=p) for p in pages}
        raw = run_interleaved("pages", arms, shared_fields(a, ctx), deep, a.new, a.rounds)
        names = list(arms)
        payload["raw"]["pages"] = raw
        payload["pages"] = summarise(raw, names[0], [(n, names[0]) for n in names[1:]])
        payload["tables"]["pages"] = sweep_table(f"deep tier ({deep} cells), adaptive arm, by --kv-page. {header}",
                                                 payload["pages"], "page")
    if policies:
        mid, convs = g.tiers["middle"], 3
        rounds = max(a.rounds, 2 * convs) if not a.quick else convs
        ctx = mid + rounds * (TURN_CELLS + a.new + 1) + a.new + TURN_CELLS
        pool = convs * -(-ctx // g.chunk) * g.chunk
        check_memory("eviction", len(policies), pool, g.cap)
        arms = {p: g.arm_config("cap", evict=p) for p in policies}
        raw = run_interleaved("evict", arms, shared_fields(a, ctx, pool), mid, a.new, rounds, conversations=convs)
        payload["raw"]["evict"] = raw
        payload["evict"] = summarise(raw, policies[0], [(p, policies[0]) for p in policies[1:]])
        payload["tables"]["evict"] = sweep_table(
            f"--kv-evict: {convs} parked conversations of {mid} cells take turns in one lane (round r continues "
            f"conversation r mod {convs}); cap arm, arena {g.cap} cells; MiB/turn counts the turn's admissions too. "
            f"{a.new} new tokens, {rounds} rounds", payload["evict"], "policy")
    print(f"total {time.perf_counter() - t0:.0f} s")
    os.makedirs(a.out, exist_ok=True)
    json_path = os.path.join(a.out, "ring.json")
    with open(json_path, "w") as f:
        json.dump(payload, f, indent=1)
    png_path = os.path.join(a.out, "ring.png")
    plot(payload["tiers"], g.tiers, payload.get("pages"), f"strata resident K/V ring, SmolLM2-135M, {g.describe()}; "
         f"{a.device}, {a.new} tokens x {a.rounds} rounds, synthetic K/V", png_path)
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

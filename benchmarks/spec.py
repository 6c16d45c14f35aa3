"""Speculative decoding (issue 14): decode tok/s with n-gram drafts (prompt lookup) against
without, on a workload that repeats its input and on open chat, at 1 lane and 8 lanes; the
drafts' acceptance; and the verify step's cost per extra row (adaptive.py's DRAFT_COST).

Workloads (spec_parts/prompts.py): "repeat" rewrites a 50-line excerpt of a strata module
with one variable renamed, or summarises a README section quoting it; "chat" asks open
questions. Greedy (temperature 0), so both arms emit the same tokens ("same tokens" checks).

Arms: two engines of the default model (bf16, --batch 7, --max-context 2048), --spec ngram
(--spec-k, adaptive below it) and --spec off, held in one process and stepped alternately,
arm order rotating per round. Decode tok/s = tokens of pure decode steps / their wall time
(steps once every request has its first token: no prefill timed). Per (workload, lanes),
`--rounds` rounds; the ratio is the median of per-round paired ratios. Absolute tok/s on a
shared machine are noise; ratios within the run count.

DRAFT_COST (spec_parts/draft_cost.py): the spec engine steps one request with a fixed k of
random (rejected) drafts per step, k cycling 0..6 step by step; ratio(k) = step(k) / step(0).

llama.cpp's speculative decoding is the peer where a build is on PATH (spec_parts/peer.py);
this benchmark does not build it, and says when it is absent.

    python benchmarks/spec.py [--rounds 5] [--new 128] [--lanes 1,8] [--quick]

Writes benchmarks/results/spec.json and spec.png (or under --out).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from strata.config import DEFAULT_SPEC_K, EngineConfig  # noqa: E402
from benchmarks.common import RESULTS_DIR, wait_for_quiet  # noqa: E402
from benchmarks.spec_parts import draft_cost, peer  # noqa: E402
from benchmarks.spec_parts.interleave import run_rounds  # noqa: E402
from benchmarks.spec_parts.plot import plot  # noqa: E402
from benchmarks.spec_parts.prompts import workloads  # noqa: E402
from benchmarks.spec_parts.summary import OFF, SPEC, cell_summary, verdict  # noqa: E402
from benchmarks.spec_parts.tables import cost_table, speed_table, verdict_text  # noqa: E402

MAX_CONTEXT = 2048
BATCH = 7  # 8 lanes: the main session + 7 slots


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new", type=int, default=128, help="max new tokens per request (greedy, stops at EOS)")
    ap.add_argument("--lanes", default="1,8", help="lane counts, each at most 8")
    ap.add_argument("--workloads", default="repeat,chat")
    ap.add_argument("--spec-k", type=int, default=DEFAULT_SPEC_K, help="--spec-k of the ngram arm")
    ap.add_argument("--cost-k", type=int, default=6, help="DRAFT_COST: k from 0 to this")
    ap.add_argument("--cost-cycles", type=int, default=16, help="DRAFT_COST: steps per k; 0 skips it")
    ap.add_argument("--cost-lanes", default=None, help="DRAFT_COST: lane counts (default 1,8; --quick: 1)")
    ap.add_argument("--dtype", default="bfloat16", help="both arms' --dtype (float32: greedy ties hold exactly)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a shared machine: with 2 threads and "
                    "another busy process, OpenMP waits can make steps 10-50x slower)")
    ap.add_argument("--out", default=RESULTS_DIR, help="directory for spec.json and spec.png")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: the repeat workload at 1 lane, 16 tokens, 1 round; DRAFT_COST k 0..2, 3 steps each")
    a = ap.parse_args()
    if a.quick:
        a.new, a.rounds, a.cost_cycles, a.cost_k, a.lanes, a.workloads = 16, 1, 3, 2, "1", "repeat"
    a.cost_lanes = a.cost_lanes or ("1" if a.quick else "1,8")
    a.lane_counts = [int(x) for x in a.lanes.split(",") if x.strip()]
    a.cost_lane_counts = [int(x) for x in a.cost_lanes.split(",") if x.strip()]
    if any(not 1 <= n <= BATCH + 1 for n in a.lane_counts + a.cost_lane_counts):
        ap.error(f"lane counts must be 1..{BATCH + 1}")
    return a


def main() -> int:
    a = parse_args()
    from strata.drafting.adaptive import DRAFT_COST_FIRST, DRAFT_COST_MORE
    from benchmarks.spec_parts.arm import SpecArm

    llama = peer.detect()
    print(f"llama.cpp peer: {llama['note']}")
    quiet = wait_for_quiet(0 if a.quick else 60)
    t0 = time.perf_counter()
    shared = {"model": None, "batch": BATCH, "max_context": MAX_CONTEXT, "threads": a.threads, "dtype": a.dtype}
    arms = {SPEC: SpecArm(SPEC, EngineConfig(**shared, spec="ngram", spec_k=a.spec_k)),
            OFF: SpecArm(OFF, EngineConfig(**shared, spec="off"))}
    prompts = workloads(arms[SPEC].engine.tokenizer, MAX_CONTEXT - a.new - a.spec_k - 2)
    print(f"engines loaded in {time.perf_counter() - t0:.0f} s; prompt tokens: "
          + "; ".join(f"{w} {min(map(len, p))}-{max(map(len, p))}" for w, p in prompts.items()), file=sys.stderr)
    header = (f"default model {a.dtype}, {a.threads} thread(s), up to {a.new} new tokens, {a.rounds} round(s), "
              "arms stepped alternately; absolute tok/s on a shared machine are noise, ratios count")
    raw, cells = {}, []
    for w in [x.strip() for x in a.workloads.split(",") if x.strip()]:
        for lanes in a.lane_counts:
            label = f"{w} x{lanes}"
            raw[label] = run_rounds(label, arms, prompts[w], lanes, a.new, a.rounds)
            cells.append(cell_summary(w, lanes, raw[label]))
    costs = []
    if a.cost_cycles:
        for lanes in a.cost_lane_counts:
            c = draft_cost.measure(arms[SPEC], prompts["repeat"][:lanes], a.cost_k, a.cost_cycles)
            if c is None:
                print(f"  DRAFT_COST at {lanes} lane(s): no step took drafts (the lanes fill a step's rows)",
                      file=sys.stderr)
                continue
            costs.append(c)
            print(f"  DRAFT_COST at {lanes} lane(s): slope {c['draft_cost']:.3f}", file=sys.stderr)
    elapsed = time.perf_counter() - t0
    for arm in arms.values():
        arm.close()
    tables, v = {}, verdict(cells)
    if cells:
        tables["speed"] = speed_table(cells, header)
        tables["verdict"] = verdict_text(v)
    if costs:
        tables["cost"] = cost_table(costs, (DRAFT_COST_FIRST, DRAFT_COST_MORE))
    print(f"llama.cpp peer: {llama['note']}")
    print(f"total {elapsed:.0f} s")
    payload = {"args": vars(a), "quiet": quiet, "engine": shared,
               "peer_llama_cpp": llama, "cells": cells, "verdict": v, "draft_cost": costs,
               "draft_cost_in_adaptive": {"first": DRAFT_COST_FIRST, "more": DRAFT_COST_MORE}, "tables": tables, "raw": raw, "elapsed_s": elapsed}
    os.makedirs(a.out, exist_ok=True)
    json_path = os.path.join(a.out, "spec.json")
    with open(json_path, "w") as f:
        json.dump(payload, f, indent=1)
    png_path = os.path.join(a.out, "spec.png")
    # The peer is never measured here (spec_parts/peer.py): the title says whether a build was found.
    plot(cells, costs, f"strata --spec ngram vs off, SmolLM2-135M {a.dtype}, {a.new} new tokens x {a.rounds} rounds; "
         f"llama.cpp peer: not measured ({'a build is on PATH, its arm is not wired in' if llama['available'] else 'no build on PATH'})",
         png_path)
    print(f"wrote {json_path} and {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The expert cache and the device budget (issue 26): hit ratio and bytes per token of each
eviction policy, with and without prefetch, against Belady's optimal eviction, on synthetic
routing traces of stated locality; and across depths 1K / 32K / 128K of synthetic K/V, a
fixed split of one device budget against the adaptive one, in bytes copied per token.

Nothing here runs a model: the traces are synthetic (benchmarks/moe_parts/traces.py says
how they are made; a random router routes almost uniformly, so the `uniform` trace is what
one would measure on random weights), the cache is strata's own slot planner (the code
CachedBank runs; its exactness and accounting are tests/unit/test_moe_cache*.py's job),
the budget is strata's rule, and the ring's bytes are kv/residency.py's plan. Bytes are an
OLMoE-shaped model's (moe_parts/budget.py), bf16. tok/s needs an accelerator and the wired
engine (benchmarks/moe_cuda.sh).

    python benchmarks/moe_cache.py [--steps 512] [--slots 8,16,32] [--device-memory 16384] [--quick]

Writes moe_cache.json and moe_cache.png under --out (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, cpu_name, print_table, write_json  # noqa: E402
from benchmarks.moe_parts import budget as B  # noqa: E402
from benchmarks.moe_parts.cache import run_belady, run_policy  # noqa: E402
from benchmarks.moe_parts.plot import plot  # noqa: E402
from benchmarks.moe_parts.traces import TRACES, make_trace  # noqa: E402
from strata.moe.evict import DEFAULT_EVICT, EVICT_POLICIES  # noqa: E402

MIB = 1 << 20


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=512, help="decode steps per trace")
    ap.add_argument("--warm", type=int, default=64, help="steps before counting (the slots fill)")
    ap.add_argument("--layers", type=int, default=B.LAYERS, help="MoE layers in the traces")
    ap.add_argument("--lanes", type=int, default=1, help="tokens per step (lanes decoding together)")
    ap.add_argument("--slots", default="8,16,32", help="expert slots per layer compared")
    ap.add_argument("--device-memory", type=int, default=16384, help="the budget, MiB (a 16 GiB card)")
    ap.add_argument("--seed", type=int, default=0)
    add_quick_and_out(ap, "48 steps, 4 layers, slots 8,16, depths as in the full run")
    a = ap.parse_args()
    if a.quick:
        a.steps, a.warm, a.layers, a.slots = 48, 8, 4, "8,16"
    return a


def cache_rows(a, slots: list[int]) -> list[dict]:
    rows = []
    for spec in TRACES:
        trace = make_trace(spec, a.layers, B.EXPERTS, B.TOP_K, a.steps + a.warm, a.lanes, a.seed)
        for n in slots:
            arms = [("belady", run_belady(trace, n, a.warm))]
            arms += [(f"{p}{' +prefetch' if pf else ''}", run_policy(trace, n, p, pf, a.warm))
                     for p in EVICT_POLICIES for pf in (False, True)]
            best = arms[0][1]["copies_per_token"]
            for arm, r in arms:
                copies = r["copies_per_token"]
                rows.append({"trace": spec.name, "label": spec.label(), "slots": n, "arm": arm,
                             "hit_ratio": r["hit_ratio"], "copies_per_token": copies,
                             "mib_per_token": copies * B.EXPERT_BYTES / MIB,
                             "vs_belady": copies / best if best else (1.0 if not copies else float("inf")),
                             "wasted_prefetches_per_token": r["wasted_prefetches_per_token"]})
    return rows


def pick_policy(rows: list[dict]) -> tuple[str, dict[str, float]]:
    """The policy with the fewest bytes per token without prefetch, as the geometric mean of its
    ratio to Belady over the traces with locality and every slot count."""
    score = {}
    for p in EVICT_POLICIES:
        rs = [r["vs_belady"] for r in rows if r["arm"] == p and r["trace"] != "uniform" and r["vs_belady"] > 0]
        prod = 1.0
        for x in rs:
            prod *= x
        score[p] = prod ** (1 / len(rs)) if rs else float("nan")
    return min(score, key=score.get), score


def main() -> None:
    a = parse_args()
    slots = [int(x) for x in a.slots.split(",") if x]
    t0 = time.perf_counter()
    rows = cache_rows(a, slots)
    title = (f"strata expert cache, OLMoE-shaped ({B.EXPERTS} experts, top-{B.TOP_K}, {a.layers} layers, bf16 "
             f"experts of {B.EXPERT_BYTES / MIB:.0f} MiB), {a.lanes} lane(s), {a.steps} steps after {a.warm}; "
             f"{cpu_name()}")
    print_table(f"{title}\nsynthetic traces: " + "; ".join(s.label() for s in TRACES),
                ["trace", "slots", "arm", "hit ratio", "MiB/token", "x Belady bytes", "wasted prefetch/token"],
                [[r["trace"], r["slots"], r["arm"], r["hit_ratio"], r["mib_per_token"], r["vs_belady"],
                  r["wasted_prefetches_per_token"]] for r in rows])
    best, score = pick_policy(rows)
    print(f"policy by measurement (geometric mean of bytes / Belady's, traces with locality, no prefetch): "
          + ", ".join(f"{p} {v:.3f}" for p, v in score.items())
          + f" -> {best}; the default is {DEFAULT_EVICT}{'' if best == DEFAULT_EVICT else ' (they differ)'}")

    setup = B.Setup(device_mib=a.device_memory, cap=49152, default_ring=32768, page=256, new=a.steps + a.warm)
    depths = {"1K": 1024, "32K": 32768, "128K": 131072}
    budget_trace = make_trace(TRACES[2], a.layers, B.EXPERTS, B.TOP_K, a.steps + a.warm, 1, a.seed + 1)
    d = B.run_depths(setup, depths, budget_trace, DEFAULT_EVICT, a.warm)
    btitle = (f"one device budget of {a.device_memory} MiB (resident weights {B.RESIDENT_BYTES / MIB:.0f} MiB, "
              f"one slot in every layer {B.SLOT_BYTES / MIB:.0f} MiB, one cell {B.CELL_BYTES // 1024} KiB), ring cap "
              f"{setup.cap}, default {setup.default_ring}, page {setup.page}, +{setup.new} tokens; synthetic K/V; "
              f"experts on the {TRACES[2].name} trace, {DEFAULT_EVICT}")
    print()
    print_table(btitle, ["depth", "arm", "ring cells", "expert slots", "experts MiB/tok", "ring MiB/tok",
                         "MiB/tok", "x adaptive"],
                [[t, arm, v["ring_cells"], v["expert_slots"], v["expert_mib_per_token"], v["ring_mib_per_token"],
                  v["mib_per_token"], v["mib_per_token"] / d[t]["adaptive"]["mib_per_token"]
                  if d[t]["adaptive"]["mib_per_token"] else (1.0 if not v["mib_per_token"] else float("inf"))]
                 for t, arms in d.items() for arm, v in arms.items()])
    seq = B.serve_sequence(setup, depths, lanes=2)
    print()
    print_table("strata serve, 2 lanes: the split after each event (adaptive)",
                ["event", "expert slots", "ring cells", "GiB used"],
                [[r["event"], r["expert_slots"], r["ring_cells"], r["used_gib"]] for r in seq])
    payload = {"cpu": cpu_name(), "args": vars(a), "traces": [s.label() for s in TRACES], "cache": rows,
               "policy_scores": score, "best_policy": best, "default_policy": DEFAULT_EVICT,
               "budget": {"setup": vars(setup), "depths": d, "serve": seq}, "seconds": time.perf_counter() - t0}
    path = write_json("moe_cache.json", payload, a.out)
    plot(rows, d, title, os.path.join(a.out, "moe_cache.png"))
    print(f"wrote {path} and moe_cache.png")


if __name__ == "__main__":
    main()

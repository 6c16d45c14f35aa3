"""Dense bfloat16 projections at prompt row counts: strata's AMX GEMM against oneDNN's.

Two parts, every arm in this process, interleaved:

1. One decoder layer of the default model (q|k|v 960 x 576, o 576 x 576, gate|up 3072 x 576,
   down 576 x 1536) at `--rows` rows: torch's `F.linear` on the plain weight (oneDNN,
   reordering it every call), oneDNN on the weight held in its blocked layout (what strata
   runs without AMX, `STRATA_DENSE_GEMM=onednn`), and strata's AMX kernel (csrc/amx_gemm.cpp,
   what strata runs where the CPU has AMX-BF16). A layer's time is the sum of its
   projections' medians of `--reps` calls; the table gives the median of `--rounds` and each
   arm's speed against the blocked oneDNN one.
2. The engine (`--weights auto`, bf16): one `--prompt`-token prompt read in pieces of each
   `--pieces` length, the dense weights held for the AMX kernel (`STRATA_DENSE_GEMM=auto`) or
   for oneDNN, and each engine's warm-up (`engine.warm_up()`: oneDNN makes a kernel for every
   row count up to the piece length; the AMX kernel needs none).

Without AMX-BF16 (or without strata's extension) the AMX arms are left out and it says so.

    python benchmarks/dense_gemm.py [--threads 2] [--rounds 5] [--rows 1,8,48,96,512]
                                    [--pieces 48,96,512] [--prompt 512] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (add_quick_and_out, cold_prompt_ms, cpu_name, engine_with_env, print_table, pyplot,
                               write_json)
from benchmarks.decode import prompt_ids
from benchmarks.quant_kernels import LAYER


def layer_us(calls: dict, xs: dict[int, torch.Tensor], reps: int) -> float:
    """Sum over the layer's projections of the median of `reps` timed calls, microseconds;
    `xs`: a contiguous [rows, k] input for each input width k."""
    total = 0.0
    for fn in calls.values():
        x = xs[fn.k]
        fn(x)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn(x)
            times.append(time.perf_counter() - t)
        total += statistics.median(times) * 1e6
    return total


def gemm_arms(amx) -> dict[str, dict]:
    """arm -> {projection -> callable(x) with .k}: the default model's layer, random bf16 weights."""
    from strata.models.packed import PackedWeight

    g = torch.Generator().manual_seed(0)
    arms: dict[str, dict] = {"torch F.linear": {}, "oneDNN blocked": {}}
    if amx is not None:
        arms["strata AMX"] = {}
    for name, (out, k) in LAYER.items():
        w = torch.randn(out, k, generator=g).bfloat16()
        os.environ["STRATA_DENSE_GEMM"] = "onednn"
        onednn = PackedWeight(w)
        del os.environ["STRATA_DENSE_GEMM"]
        fns = {"torch F.linear": lambda x, w=w: F.linear(x, w), "oneDNN blocked": onednn.mm}
        if amx is not None:
            fns["strata AMX"] = PackedWeight(w, amx=amx).mm
        for arm, fn in fns.items():
            wrapped = (lambda x, fn=fn: fn(x))
            wrapped.k = k
            arms[arm][name] = wrapped
    return arms


def engine_prefill(args, amx) -> dict:
    """{"<gemm> / <piece>": {"ms": median prompt ms, "warm_s": warm-up s}} for each arm and piece."""
    from strata.config import EngineConfig

    gemms = ["onednn"] + (["amx"] if amx is not None else [])
    out = {}
    for piece in args.pieces:
        engines = {}
        for gemm in gemms:
            e = engine_with_env(EngineConfig(dtype="bfloat16", weights="auto", max_context=args.prompt + 64, batch=0,
                                             prefill_chunk=piece, threads=args.threads, spec="off"),
                                STRATA_DENSE_GEMM=gemm)
            t = time.perf_counter()
            e.warm_up()
            engines[gemm] = (e, time.perf_counter() - t)
        times = {g: [] for g in gemms}
        for r in range(args.rounds + 1):  # the first round warms the caches and is dropped
            for gemm, (e, _) in engines.items():
                ms = cold_prompt_ms(e, prompt_ids(e.tokenizer, args.prompt, 300 + r))
                if r:
                    times[gemm].append(ms)
        for gemm, (_, warm) in engines.items():
            out[f"{gemm} / {piece}"] = {"gemm": gemm, "piece": piece, "ms": statistics.median(times[gemm]),
                                       "warm_s": warm}
        del engines
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--rows", default="1,8,48,96,512")
    p.add_argument("--pieces", default="48,96,512")
    p.add_argument("--prompt", type=int, default=512)
    add_quick_and_out(p, "rows 1 and 32, a 32-token prompt in pieces of 16 and 32, 1 round")
    args = p.parse_args()
    if args.quick:
        args.rows, args.pieces, args.prompt, args.rounds, args.reps = "1,32", "16,32", 32, 1, 3
    args.rows = [int(r) for r in args.rows.split(",")]
    args.pieces = [int(r) for r in args.pieces.split(",")]
    torch.set_num_threads(args.threads)
    from strata.models.packed import amx_gemm, packs_weights

    if not packs_weights(torch.bfloat16, torch.device("cpu")):
        print("this CPU has no native bfloat16 GEMM (no AVX-512 BF16, no AMX): strata keeps plain weights; "
              "the blocked arm below is oneDNN's all the same")
    amx = amx_gemm()
    if amx is None:
        print("no AMX-BF16 GEMM on this CPU (or build): the strata AMX arms are left out")
    cpu = cpu_name()

    arms = gemm_arms(amx)
    per_round = {arm: {r: [] for r in args.rows} for arm in arms}
    for _ in range(args.rounds):
        for rows in args.rows:
            xs = {k: torch.randn(rows, k).bfloat16() for _, k in LAYER.values()}
            for arm, calls in arms.items():
                per_round[arm][rows].append(layer_us(calls, xs, args.reps))
    gemm = {arm: {r: statistics.median(v) for r, v in by_rows.items()} for arm, by_rows in per_round.items()}
    base = gemm["oneDNN blocked"]
    table = [[arm] + [gemm[arm][r] for r in args.rows] + [base[r] / gemm[arm][r] for r in args.rows] for arm in gemm]
    print_table(f"one layer's dense bf16 projections, us (median of {args.rounds}), {args.threads} threads; "
                f"speed against oneDNN blocked; {cpu}",
                ["arm", *(f"{r} rows" for r in args.rows), *(f"x at {r}" for r in args.rows)], table)

    pre = engine_prefill(args, amx)
    rows = []
    for piece in args.pieces:
        ref = pre[f"onednn / {piece}"]
        for g in ("onednn", "amx"):
            if f"{g} / {piece}" in pre:
                r = pre[f"{g} / {piece}"]
                rows.append([f"{g}, pieces of {piece}", r["ms"], ref["ms"] / r["ms"], r["warm_s"]])
    print_table(f"a {args.prompt}-token prompt through the engine, ms (median of {args.rounds}), "
                f"{args.threads} threads; speed against oneDNN; {cpu}",
                ["dense GEMM, prompt pieces", "ms", "x oneDNN", "warm-up s"], rows)

    payload = {"args": vars(args), "cpu": cpu, "amx": amx is not None, "layer_us": gemm, "prefill": pre}
    print(f"raw numbers: {write_json('dense_gemm.json', payload, args.out)}")
    plt = pyplot()
    if plt is None:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for arm in gemm:
        a1.plot(args.rows, [gemm[arm][r] for r in args.rows], marker="o", label=arm)
    a1.set(xscale="log", yscale="log", xlabel="rows", ylabel="us a layer", title="dense bf16 projections")
    a1.legend()
    for i, g in enumerate(("onednn", "amx")):
        vals = [pre[f"{g} / {pc}"]["ms"] for pc in args.pieces if f"{g} / {pc}" in pre]
        if vals:
            a2.bar([j + 0.4 * i for j in range(len(vals))], vals, width=0.4, label=g)
    a2.set_xticks([j + 0.2 for j in range(len(args.pieces))], [f"pieces of {pc}" for pc in args.pieces])
    a2.set(ylabel=f"ms for a {args.prompt}-token prompt", title="engine prefill")
    a2.legend()
    fig.suptitle(cpu, fontsize=9)
    fig.tight_layout()
    path = os.path.join(args.out, "dense_gemm.png")
    fig.savefig(path)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()

"""A prompt piece's causal attention: strata's AMX kernel against SDPA and the decode kernel.

Two parts, every arm in this process, interleaved:

1. One layer of the default model (9 query heads, 3 K/V heads, head dim 64, bf16) at each
   `--rows` x `--cells` (the piece's rows end at the last cell): SDPA's flash kernel (what
   strata ran before, `STRATA_PROMPT_ATTENTION=sdpa`), the fused decode kernel reading every
   row over its own cells (what strata runs for short pieces), and strata's AMX prompt
   attention (csrc/amx_attention.cpp). Medians of `--rounds` medians of `--reps` calls, us,
   and each arm's speed against SDPA; the row at which the AMX kernel overtakes the decode
   kernel sets runner/inputs.py's SPANS_MAX_ROWS_BESIDE_PROMPT_KERNEL.
2. The engine (`--weights auto`, bf16): a `--prompt`-token prompt read in one piece with the
   AMX attention and with SDPA (`STRATA_PROMPT_ATTENTION=auto|sdpa`), ms per prompt.

Without AMX-BF16 (or without strata's extension) the AMX arms are left out and it says so.

    python benchmarks/prompt_attention.py [--threads 2] [--rounds 5] [--rows 8,16,48,96,512]
                                          [--cells 128,512,1024] [--prompt 512] [--quick] [--out DIR]
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

HEADS, KV_HEADS, DIM = 9, 3, 64  # the default model's attention


def median_us(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def arms(ops, rows: int, cells: int, k: torch.Tensor, v: torch.Tensor) -> dict:
    """arm -> callable for one layer's attention of a `rows`-row piece ending at cell `cells`."""
    q = torch.randn(rows, HEADS, DIM).bfloat16()
    scale = DIM ** -0.5
    kc, vc = k[:, :cells].unsqueeze(0), v[:, :cells].unsqueeze(0)
    mask = None
    if rows < cells:  # row r sees cells up to cells - rows + r (SDPA's bool mask)
        mask = torch.arange(cells) <= torch.arange(cells - rows, cells).unsqueeze(1)
    qt = q.transpose(0, 1).unsqueeze(0)
    out = {"SDPA": lambda: F.scaled_dot_product_attention(qt, kc, vc, attn_mask=mask, is_causal=mask is None,
                                                          enable_gqa=True)}
    if ops is not None:
        spans = torch.tensor([[0, cells - rows + r + 1] for r in range(rows)])
        row_spans = torch.arange(rows + 1)
        out["decode kernel"] = lambda: ops.decode_attention(q, k, v, spans, row_spans, scale)
        if ops.amx_available():
            whole = torch.tensor([[0, cells]])
            out["strata AMX"] = lambda: ops.prompt_attention(q, k, v, whole, scale)
    return out


def engine_prefill(args, amx: bool) -> dict:
    """{choice: median ms of a --prompt-token prompt in one piece} for the AMX attention and SDPA."""
    from strata.config import EngineConfig

    config = EngineConfig(dtype="bfloat16", weights="auto", max_context=args.prompt + 64, batch=0,
                          prefill_chunk=args.prompt, threads=args.threads, spec="off")
    engines = {c: engine_with_env(config, STRATA_PROMPT_ATTENTION=c) for c in ["sdpa"] + (["amx"] if amx else [])}
    times = {c: [] for c in engines}
    for r in range(args.rounds + 1):  # the first round warms the caches and is dropped
        for choice, e in engines.items():
            ms = cold_prompt_ms(e, prompt_ids(e.tokenizer, args.prompt, 400 + r))
            if r:
                times[choice].append(ms)
    return {c: statistics.median(t) for c, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--rows", default="8,16,48,96,512")
    p.add_argument("--cells", default="128,512,1024")
    p.add_argument("--prompt", type=int, default=512)
    add_quick_and_out(p, "8 and 32 rows over 64 cells, a 32-token prompt, 1 round")
    args = p.parse_args()
    if args.quick:
        args.rows, args.cells, args.prompt, args.rounds, args.reps = "8,32", "64", 32, 1, 3
    args.rows = [int(r) for r in args.rows.split(",")]
    args.cells = [int(c) for c in args.cells.split(",")]
    torch.set_num_threads(args.threads)
    from strata.models.fused import load_decode_ops

    ops = load_decode_ops(True)
    amx = ops is not None and hasattr(ops, "prompt_attention") and ops.amx_available()
    if not amx:
        print("no AMX-BF16 on this CPU (or no strata extension): the strata AMX arms are left out")
    cpu = cpu_name()
    k = torch.randn(KV_HEADS, max(args.cells), DIM).bfloat16()
    v = torch.randn(KV_HEADS, max(args.cells), DIM).bfloat16()
    shapes = [(r, c) for c in args.cells for r in args.rows if r <= c]
    per_round: dict[tuple, dict[str, list]] = {s: {} for s in shapes}
    for _ in range(args.rounds):
        for shape in shapes:
            for arm, fn in arms(ops, *shape, k, v).items():
                per_round[shape].setdefault(arm, []).append(median_us(fn, args.reps))
    us = {s: {arm: statistics.median(v) for arm, v in by_arm.items()} for s, by_arm in per_round.items()}
    names = list(next(iter(us.values())))
    table = [[r, c] + [us[(r, c)][a] for a in names] + [us[(r, c)]["SDPA"] / us[(r, c)][a] for a in names[1:]]
             for r, c in shapes]
    print_table(f"one layer's prompt attention ({HEADS} heads, {KV_HEADS} K/V heads, dim {DIM}, bf16), us "
                f"(median of {args.rounds}), {args.threads} threads; speed against SDPA; {cpu}",
                ["rows", "cells", *names, *(f"x SDPA {a}" for a in names[1:])], table)

    pre = engine_prefill(args, amx)
    rows = [[c, ms, pre["sdpa"] / ms] for c, ms in pre.items()]
    print_table(f"a {args.prompt}-token prompt in one piece through the engine, ms (median of {args.rounds}), "
                f"{args.threads} threads; speed against SDPA; {cpu}", ["prompt attention", "ms", "x SDPA"], rows)

    payload = {"args": vars(args), "cpu": cpu, "amx": amx,
               "layer_us": [{"rows": r, "cells": c, **us[(r, c)]} for r, c in shapes], "prefill_ms": pre}
    print(f"raw numbers: {write_json('prompt_attention.json', payload, args.out)}")
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(args.cells), figsize=(4 * len(args.cells), 3.6), squeeze=False)
    for ax, cells in zip(axes[0], args.cells):
        rs = [r for r in args.rows if r <= cells]
        for arm in names:
            ax.plot(rs, [us[(r, cells)][arm] for r in rs], marker="o", label=arm)
        ax.set(xscale="log", yscale="log", xlabel="rows", ylabel="us a layer", title=f"pieces ending at cell {cells}")
        ax.legend(fontsize=8)
    fig.suptitle(f"{cpu}; a {args.prompt}-token prompt: " + ", ".join(f"{c} {ms:.1f} ms" for c, ms in pre.items()),
                 fontsize=9)
    fig.tight_layout()
    path = os.path.join(args.out, "prompt_attention.png")
    fig.savefig(path)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()

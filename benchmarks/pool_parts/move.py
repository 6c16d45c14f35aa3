"""Part 1: the time `Engine.move` takes to move an idle conversation between lanes, by length.

The arm also records the engine's idle memory right after start, which part 2a tabulates
(`memory.idle`) from the same child processes.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import TYPE_CHECKING

from benchmarks.common import available_mib, peak_rss_mib, print_table
from benchmarks.pool_parts import (
    BYTES_PER_CELL,
    KIB,
    LAYOUTS,
    MIB,
    MODEL_OVERHEAD,
    MOVE_CONTEXT,
    cells_label,
)
from benchmarks.pool_parts.synthetic import Synthetic, make_engine, memory_now, random_tokens

if TYPE_CHECKING:
    from benchmarks.pool import Run

MOVE_LENGTHS = (1024, 8192, 32768, 131072, 262144)


def arm_move(p: dict) -> dict:
    """Idle memory right after start, then lane moves at every length (parts 1 and 2)."""
    layout = p["layout"]
    t0 = time.perf_counter()
    engine = make_engine(p, layout, p["max_context"], 1, p["max_context"], 256)
    start = {"start_s": time.perf_counter() - t0, "kv_bytes": engine._kv.num_bytes,
             "num_chunks": engine._layout.pool.num_total, **memory_now()}
    kv = engine._kv
    vocab = engine.model_config.vocab_size
    sched = engine._scheduler
    synth = Synthetic(kv, seed=1)
    lengths = []
    for n in p["lengths"]:
        sched.clear_cache()
        conv = engine.restore(random_tokens(n, n, vocab), [0], lane=0)
        fill_s = synth.fill(conv.table, n)
        times, cpu, copied = [], [], []
        src, dst = 0, 1
        before = (sched.counters.num_moves_swap, sched.counters.num_moves_copy)
        for _ in range(p["reps"]):
            c, t = time.process_time(), time.perf_counter()
            copied.append(engine.move(src, dst))
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            src, dst = dst, src
        intact = synth.check(conv.table, n) and conv.lane == src and conv.num_cells == n
        lengths.append({
            "cells": n,
            "kv_bytes": n * kv.bytes_per_cell,
            "fill_s": fill_s,
            "move_s": times,
            "move_cpu_s": cpu,
            "median_ms": statistics.median(times) * 1e3,
            "bytes_copied": copied,
            "num_moves_swap": sched.counters.num_moves_swap - before[0],
            "num_moves_copy": sched.counters.num_moves_copy - before[1],
            "kv_intact": intact,
        })
        print(f"  {layout} {n} cells: fill {fill_s:.1f} s, move median "
              f"{lengths[-1]['median_ms']:.3f} ms, copied {copied[0]} B, intact {intact}", file=sys.stderr)
    return {"layout": layout, "bytes_per_cell": kv.bytes_per_cell, "start": start, "lengths": lengths,
            "peak_rss_mib": peak_rss_mib()}


def measure(run: Run) -> tuple[dict, dict, dict, int] | None:
    """Parts 1 and 2a's processes: `--rounds` move arms per layout, then the move table.

    Returns (raw results by layout, the arm's params, the move-time curve, bytes per cell)
    for the plot and the idle-memory table, or None when a layout has no result.
    """
    a = run.args
    s = run.fit("move/memory", lambda s: 2 * (MOVE_CONTEXT // s) * BYTES_PER_CELL + MODEL_OVERHEAD, a.scale)
    p = {**run.base(s), "max_context": MOVE_CONTEXT // s, "lengths": [n // s for n in MOVE_LENGTHS],
         "reps": a.reps}
    raw: dict[str, list[dict]] = {layout: [] for layout in LAYOUTS}
    for r in range(a.rounds):
        for layout in LAYOUTS:
            need = (2 if layout == "reserved" else 1) * p["max_context"] * BYTES_PER_CELL + MODEL_OVERHEAD
            if not run.enough(f"move/memory {layout} round {r + 1}", need):
                continue
            before = available_mib()
            t = time.perf_counter()
            res = run.child("move", {**p, "layout": layout})
            if res is not None:
                res["start"]["available_before_mib"] = before
                raw[layout].append(res)
            print(f"  round {r + 1}/{a.rounds} move {layout}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    run.payload["move"] = {"scale": s, "params": p, "raw": raw}
    if not all(raw.values()):
        run.note("move/memory: a layout has no result; its tables are left out")
        return None
    bpc = raw["pool"][0]["bytes_per_cell"]
    if bpc != BYTES_PER_CELL:
        run.note(f"the model's K/V is {bpc} bytes per cell, not the assumed {BYTES_PER_CELL}")
    rows, curve = [], {"cells": [], "reserved_ms": [], "pool_ms": []}
    problems = []
    for i, n in enumerate(p["lengths"]):
        med, best = {}, {}
        for layout in LAYOUTS:
            times = [t for res in raw[layout] for t in res["lengths"][i]["move_s"]]
            med[layout] = statistics.median(times) * 1e3
            best[layout] = min(times) * 1e3
            for res in raw[layout]:
                row = res["lengths"][i]
                if not row["kv_intact"]:
                    problems.append(f"{layout} {n} cells: K/V not intact after the moves")
                if layout == "pool" and (any(row["bytes_copied"]) or row["num_moves_copy"]):
                    problems.append(f"pool {n} cells: a move copied {max(row['bytes_copied'])} bytes")
                if layout == "reserved" and any(b != n * bpc for b in row["bytes_copied"]):
                    problems.append(f"reserved {n} cells: a move copied {row['bytes_copied']} bytes, "
                                    f"expected {n * bpc}")
        copied = raw["reserved"][0]["lengths"][i]["bytes_copied"][0]
        fill = statistics.median(res["lengths"][i]["fill_s"] for res in raw["reserved"] + raw["pool"])
        rows.append([cells_label(n), n * bpc / MIB, med["reserved"], best["reserved"], copied / MIB,
                     med["pool"] * 1e3, best["pool"] * 1e3, raw["pool"][0]["lengths"][i]["bytes_copied"][0],
                     med["reserved"] / med["pool"], fill])
        curve["cells"].append(n)
        curve["reserved_ms"].append(med["reserved"])
        curve["pool_ms"].append(med["pool"])
    n_moves = a.reps * len(raw["pool"])
    title = (f"1. lane move (Engine.move) vs conversation length: median of {n_moves} moves per cell "
             f"(reps {a.reps} x rounds {len(raw['pool'])}, lanes alternating 0->1->0), "
             f"--max-context {p['max_context']}, --kv-chunk {p['chunk']}, bf16 K/V "
             f"{bpc / KIB:.1f} KiB/cell; K/V SYNTHETIC (written into storage through the chunk table)")
    run.tables["move"] = print_table(
        title, ["cells", "K/V MiB", "reserved copy ms", "best ms", "copied MiB", "pool swap us", "best us",
                "pool copied B", "copy / swap", "synthetic fill s"], rows)
    top = rows[-1]
    swap_max_ms = max(curve["pool_ms"])
    verdict = (f"swap max {swap_max_ms * 1e3:.1f} us over all lengths (target < 1 ms: "
               f"{'met' if swap_max_ms < 1 else 'MISSED'}); swap at longest / shortest "
               f"{curve['pool_ms'][-1] / curve['pool_ms'][0]:.2f} (flat = ~1); copy / swap at "
               f"{top[0]} {top[8]:,.0f}x (target > 1000x: {'met' if top[8] > 1000 else 'MISSED'})")
    print(verdict)
    run.tables["move"] += "\n" + verdict
    run.payload["move"].update({"curve": curve, "problems": problems, "verdict": verdict})
    for pr in problems:
        run.note(f"ENGINE PROBLEM: {pr}")
    return raw, p, curve, bpc

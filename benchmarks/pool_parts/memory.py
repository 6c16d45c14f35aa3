"""Part 2: idle memory right after start (2a, from the move arms) and how many ~104K-cell
conversations a pool as large as the reserved layout's K/V holds (2b, its own arm)."""

from __future__ import annotations

import json
import statistics
import time
from typing import TYPE_CHECKING

from benchmarks.common import peak_rss_mib, print_table
from benchmarks.pool_parts import (
    BYTES_PER_CELL,
    CHUNK,
    GIB,
    KIB,
    LAYOUTS,
    MIB,
    MODEL_OVERHEAD,
    MOVE_CONTEXT,
    TURN,
    cells_label,
)
from benchmarks.pool_parts.synthetic import Synthetic, make_engine, memory_now, random_tokens

if TYPE_CHECKING:
    from benchmarks.pool import Run

CAPACITY_CELLS = 104_000  # "three conversations of about 104k" in the seed


def arm_capacity(p: dict) -> dict:
    """One layout in the reserved layout's K/V memory: restore ~104K-cell conversations one
    at a time (no lane asked for: the reserved layout puts each in a lane, displacing the
    least recently used; the pool parks it) until one makes an earlier one give way or is
    refused, and count how many were held at once; then append a short turn to each one
    still held and decode them together (each must reuse all its cached cells)."""
    from strata.errors import PoolFullError
    from strata.sampling import SamplingParams

    cells = p["cells"]
    t0 = time.perf_counter()
    engine = make_engine(p, p["layout"], p["max_context"], p["lanes"] - 1, p["pool_tokens"], 256)
    out: dict = {"start_s": time.perf_counter() - t0, "kv_bytes": engine._kv.num_bytes,
                 "num_chunks": engine._layout.pool.num_total, "start": memory_now()}
    vocab = engine.model_config.vocab_size
    synth = Synthetic(engine._kv, seed=2)
    held_after, evictions_after, refused = [], [], False
    for i in range(p["attempts"]):
        try:
            conv = engine.restore(random_tokens(cells, 1000 + i, vocab), [0], lane=None)
        except PoolFullError:
            refused = True
            break
        synth.fill(conv.table, cells)
        held_after.append(len(engine._scheduler.cache))
        evictions_after.append(engine._scheduler.counters.num_evictions)
        if evictions_after[-1]:
            break  # this one made an earlier one give way: the layout is full
    st = engine._scheduler.stats()
    out["held"] = {"held_after_each": held_after, "evictions_after_each": evictions_after, "refused": refused,
                   "num_conversations": max(held_after, default=0), "num_chunks_held": st.num_chunks_held,
                   "num_chunks_free": st.num_chunks_free, **memory_now()}
    # every conversation still held is live: a short turn appended to each, decoded together
    turn = engine.tokenizer.encode(TURN, add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=p["new"], ignore_eos=True)
    ids = [engine.submit(c.token_ids + turn, params) for c in list(engine._scheduler.cache)]
    t = time.perf_counter()
    finished = {}
    while engine.has_work:
        for o in engine.step():
            if o.finished:
                finished[o.request_id] = o
    out["turns"] = {
        "seconds": time.perf_counter() - t,
        "num_cached_tokens": [finished[i].num_cached_tokens for i in ids],
        "finish_reasons": [finished[i].finish_reason for i in ids],
        "num_output_tokens": [finished[i].num_output_tokens for i in ids],
    }
    out["peak_rss_mib"] = peak_rss_mib()
    return out


def idle(run: Run, raw: dict[str, list[dict]], p: dict) -> None:
    """Part 2a: the idle-memory table, from the move arms' `start` records."""
    rows = []
    for layout in LAYOUTS:
        st = [res["start"] for res in raw[layout]]
        rows.append([
            layout,
            "-" if layout == "reserved" else str(p["max_context"]),
            st[0]["num_chunks"],
            st[0]["kv_bytes"] / GIB,
            statistics.median(x["rss_mib"] for x in st) / KIB,
            statistics.median(x["available_before_mib"] - x["available_mib"] for x in st) / KIB,
            statistics.median(x["start_s"] for x in st),
        ])
    rows.append(["pool - reserved", "", rows[1][2] - rows[0][2], rows[1][3] - rows[0][3],
                 rows[1][4] - rows[0][4], rows[1][5] - rows[0][5], rows[1][6] - rows[0][6]])
    title = (f"2a. idle memory right after start: 2 lanes (--batch 1) at --max-context {p['max_context']}, "
             f"one process per layout and start, median of {len(raw['pool'])} starts; pool at its smallest "
             f"valid --kv-pool-tokens (one --max-context conversation)")
    run.tables["memory"] = print_table(
        title, ["layout", "--kv-pool-tokens", "chunks", "committed K/V GiB", "RSS GiB",
                "MemAvailable drop GiB", "start s"], rows)
    run.payload["move"]["memory_rows"] = rows


def capacity(run: Run) -> None:
    """Part 2b: how many ~104K conversations the reserved layout's K/V memory holds, each layout
    measured the same way in its own process (the pool as large as the reserved K/V)."""
    a = run.args
    s = run.fit("capacity", lambda s: 2 * (MOVE_CONTEXT // s) * BYTES_PER_CELL + MODEL_OVERHEAD + 512 * MIB,
                a.scale)
    chunk = max(16, CHUNK // s)
    ctx = MOVE_CONTEXT // s
    per_lane = -(-ctx // chunk)
    reserved_chunks = 2 * per_lane
    cells = CAPACITY_CELLS // s
    per_conv = -(-(cells + 64) // chunk)  # room for the appended turn and its answer
    expected = reserved_chunks // per_conv  # what the pool should hold, from chunk counts
    lanes = {"reserved": 2, "pool": expected}  # the pool gets a lane for each turn it decodes
    base = {**run.base(s), "max_context": ctx, "pool_tokens": reserved_chunks * chunk, "cells": cells,
            "attempts": expected + 1, "new": a.capacity_new}
    res = {layout: run.child("capacity", {**base, "layout": layout, "lanes": lanes[layout]}) for layout in LAYOUTS}
    run.payload["capacity"] = {"scale": s, "params": base, "expected_pool": expected, "raw": res}
    if any(r is None for r in res.values()):
        return
    rows = []
    for layout in LAYOUTS:
        r = res[layout]
        held = r["held"]["num_conversations"]
        gave_way = bool(r["held"]["refused"] or (r["held"]["evictions_after_each"] or [0])[-1])
        ok = gave_way and r["turns"]["num_cached_tokens"] == [cells] * len(r["turns"]["num_cached_tokens"])
        rows.append([f"{layout} ({lanes[layout]} lanes)", r["num_chunks"], r["kv_bytes"] / GIB, held,
                     "/".join(map(str, r["held"]["held_after_each"])), "yes" if ok else "NO",
                     f"{r['turns']['seconds']:.1f}"])
        if not ok:
            run.note(f"ENGINE PROBLEM? {layout} capacity did not verify: {json.dumps(r)[:800]}")
    rows.append(["pool / reserved", "", rows[1][2] / rows[0][2], rows[1][3] / rows[0][3], "", "", ""])
    if rows[1][3] != expected:
        run.note(f"capacity: the pool held {rows[1][3]} conversations, its chunk counts say {expected}")
    title = (f"2b. ~{cells_label(cells)}-cell conversations ({cells} cells) held in the reserved layout's K/V "
             f"memory (2 lanes x --max-context {ctx}, --kv-chunk {chunk}; the pool as large); K/V SYNTHETIC. "
             f"Each layout restores conversations one at a time until one makes an earlier one give way "
             f"(held = the most held at once); verified = that happened, and a {a.capacity_new}-token turn "
             f"appended to each one still held reused all its {cells} cached cells, decoded together")
    run.tables["capacity"] = print_table(
        title, ["layout", "chunks", "K/V GiB", "conversations held", "held after each restore", "verified",
                "turns s"], rows)

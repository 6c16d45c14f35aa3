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
    """A pool as large as the reserved layout's K/V: restore the computed number of ~104K-cell
    conversations (one per lane), append a short turn to each and decode them together, then
    check that one more conversation makes the least recently used one give way."""
    from strata.errors import PoolFullError
    from strata.sampling import SamplingParams

    n_conv, cells = p["num_conversations"], p["cells"]
    t0 = time.perf_counter()
    engine = make_engine(p, "pool", p["max_context"], n_conv - 1, p["pool_tokens"], 256)
    out: dict = {"start_s": time.perf_counter() - t0, "kv_bytes": engine.kv.num_bytes,
                 "num_chunks": engine.layout.pool.num_total, "start": memory_now()}
    vocab = engine.model_config.vocab_size
    synth = Synthetic(engine.kv, seed=2)
    convs = []
    for i in range(n_conv):
        conv = engine.restore(random_tokens(cells, 1000 + i, vocab), [0], lane=i)
        synth.fill(conv.table, cells)
        convs.append(conv)
    st = engine.scheduler.stats()
    out["held"] = {"num_conversations": len(engine.scheduler.cache), "num_chunks_held": st.num_chunks_held,
                   "num_chunks_free": st.num_chunks_free, "chunks_per_lane": list(st.chunks_per_lane),
                   **memory_now()}
    # every held conversation is live: a short turn appended to each, all lanes decoding together
    turn = engine.tokenizer.encode(TURN, add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=p["new"], ignore_eos=True)
    ids = [engine.add_request(c.token_ids + turn, params) for c in convs]
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
    # one more conversation of the same size: the pool has no free room left for it, so the
    # least recently used idle conversation gives way (or, if none could, it is refused)
    before = engine.scheduler.counters.num_evictions
    try:
        engine.restore(random_tokens(cells, 2000, vocab), [0], lane=None)
        refused = False
    except PoolFullError:
        refused = True
    out["one_more"] = {"num_evictions": engine.scheduler.counters.num_evictions - before, "refused": refused,
                       "num_conversations": len(engine.scheduler.cache),
                       "num_chunks_free": engine.scheduler.stats().num_chunks_free}
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
    """Part 2b: how many ~104K conversations the reserved layout's memory holds as a pool."""
    a = run.args
    s = run.fit("capacity", lambda s: 2 * (MOVE_CONTEXT // s) * BYTES_PER_CELL + MODEL_OVERHEAD + 512 * MIB,
                a.scale)
    chunk = max(16, CHUNK // s)
    ctx = MOVE_CONTEXT // s
    per_lane = -(-ctx // chunk)
    reserved_chunks = 2 * per_lane
    cells = CAPACITY_CELLS // s
    per_conv = -(-(cells + 64) // chunk)  # room for the appended turn and its answer
    n_conv = reserved_chunks // per_conv
    p = {**run.base(s), "max_context": ctx, "pool_tokens": reserved_chunks * chunk, "cells": cells,
         "num_conversations": n_conv, "new": a.capacity_new}
    res = run.child("capacity", p)
    run.payload["capacity"] = {"scale": s, "params": p, "raw": res}
    if res is None:
        return
    ok = (res["held"]["num_conversations"] == n_conv
          and res["turns"]["num_cached_tokens"] == [cells] * n_conv
          and res["one_more"]["num_evictions"] >= 1 and res["one_more"]["num_conversations"] == n_conv)
    reserved_fit = 2  # one conversation per lane; a third needs a third lane's whole --max-context
    rows = [
        ["reserved (2 lanes)", reserved_chunks, reserved_chunks * chunk * BYTES_PER_CELL / GIB, per_lane,
         reserved_fit, "by construction", "-"],
        [f"pool, same memory ({n_conv} lanes)", res["num_chunks"], res["kv_bytes"] / GIB, per_conv, n_conv,
         "yes" if ok else "NO", f"{res['turns']['seconds']:.1f}"],
    ]
    title = (f"2b. ~{cells_label(cells)}-cell conversations ({cells} cells) held in the reserved layout's K/V "
             f"memory (2 lanes x --max-context {ctx}, --kv-chunk {chunk}); K/V SYNTHETIC. Verified = "
             f"restored {n_conv} (one per lane), each extended by a {a.capacity_new}-token turn decoded "
             f"together (all reused {cells} cached cells), and one more made the oldest give way")
    run.tables["capacity"] = print_table(
        title, ["layout", "chunks", "K/V GiB", "chunks per conversation", "conversations held", "verified",
                "turns s"], rows)
    extra = (f"one more conversation: evictions {res['one_more']['num_evictions']}, refused "
             f"{res['one_more']['refused']}, held after {res['one_more']['num_conversations']}; "
             f"RSS with {n_conv} held {res['held']['rss_mib'] / KIB:.2f} GiB")
    print(extra)
    run.tables["capacity"] += "\n" + extra
    if not ok:
        run.note(f"ENGINE PROBLEM? capacity check did not verify: {json.dumps(res)[:800]}")

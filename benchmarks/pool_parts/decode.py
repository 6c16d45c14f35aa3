"""Part 4: two long conversations of SYNTHETIC cells per layout, each extended by a short turn,
both lanes decoding together; both layouts' engines in one process, stepped alternately."""

from __future__ import annotations

import statistics
import sys
import time
from typing import TYPE_CHECKING

from benchmarks.common import peak_rss_mib, print_table
from benchmarks.pool_parts import BYTES_PER_CELL, CHUNK, GIB, LAYOUTS, MODEL_OVERHEAD, TURN
from benchmarks.pool_parts.synthetic import Synthetic, make_engine, random_tokens

if TYPE_CHECKING:
    from benchmarks.pool import Run

DECODE_CELLS = 32768


def arm_decode(p: dict) -> dict:
    """Two long synthetic conversations per layout, each extended by a short turn, both lanes decoding
    together; both layouts' engines in this process, stepped alternately so drift hits both alike."""
    from strata.sampling import SamplingParams

    cells, new, chunk = p["cells"], p["new"], p["chunk"]
    ctx = cells + chunk
    pool_tokens = 2 * -(-ctx // chunk) * chunk  # the reserved layout's K/V, as a pool
    engines = {layout: make_engine(p, layout, ctx, 1, pool_tokens, 256) for layout in LAYOUTS}
    turn = engines["pool"].tokenizer.encode(TURN, add_special_tokens=False)
    assert cells + p["rounds"] * (len(turn) + new + 2) < ctx, "the turns do not fit in the context"
    vocab = engines["pool"].model_config.vocab_size
    prompts: dict[str, list[list[int]]] = {}
    fill_s = {}
    for layout, e in engines.items():
        synth = Synthetic(e._kv, seed=3)
        prompts[layout] = []
        fill_s[layout] = 0.0
        for lane in range(2):
            conv = e.restore(random_tokens(cells, 3000 + lane, vocab), [0], lane=lane)
            fill_s[layout] += synth.fill(conv.table, cells)
            prompts[layout].append(list(conv.token_ids))
    params = SamplingParams(temperature=0, max_tokens=new + 1, ignore_eos=True)
    raw: dict = {layout: [] for layout in LAYOUTS}
    for r in range(p["rounds"]):
        state = {}
        for layout, e in engines.items():
            ids = [e.submit(pr + turn, params) for pr in prompts[layout]]
            state[layout] = {"ids": ids, "t0": time.perf_counter(), "out": {i: [] for i in ids}, "fin": {},
                             "ttft_s": None, "step_s": [], "step_cpu_s": [], "chunks": []}
        order = LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]
        while any(e.has_work for e in engines.values()):
            for layout in order:
                e, st = engines[layout], state[layout]
                if not e.has_work:
                    continue
                ts, tc = time.perf_counter(), time.process_time()
                outs = e.step()
                dt, dc = time.perf_counter() - ts, time.process_time() - tc
                for o in outs:
                    st["out"][o.request_id].extend(o.new_token_ids)
                    if o.finished:
                        st["fin"][o.request_id] = o
                if st["ttft_s"] is None:
                    if all(st["out"][i] for i in st["ids"]):
                        st["ttft_s"] = time.perf_counter() - st["t0"]  # both turns prefilled, first tokens out
                else:
                    st["step_s"].append(dt)
                    st["step_cpu_s"].append(dc)
        for layout, e in engines.items():
            st = state[layout]
            prompts[layout] = [pr + turn + st["out"][i] for pr, i in zip(prompts[layout], st["ids"])]
            med = statistics.median(st["step_s"])
            raw[layout].append({
                "round": r,
                "turn_ttft_s": st["ttft_s"],
                "step_s": st["step_s"],
                "step_cpu_s": st["step_cpu_s"],
                "decode_tok_s": 2 / med,
                "decode_tok_s_total": 2 * len(st["step_s"]) / sum(st["step_s"]),
                "num_cached_tokens": [st["fin"][i].num_cached_tokens for i in st["ids"]],
                "num_output_tokens": [st["fin"][i].num_output_tokens for i in st["ids"]],
                "chunk_tables": [list(c.table.chunk_ids) for c in e._scheduler.cache],
            })
            print(f"  decode round {r + 1} {layout}: {2 / med:.2f} tok/s (median step {med * 1e3:.0f} ms), "
                  f"turn TTFT {st['ttft_s']:.2f} s", file=sys.stderr)
    same = all(a["num_output_tokens"] == b["num_output_tokens"] for a, b in zip(raw["reserved"], raw["pool"]))
    return {"raw": raw, "fill_s": fill_s, "same_lengths": same,
            "kv_bytes": {k: e._kv.num_bytes for k, e in engines.items()}, "peak_rss_mib": peak_rss_mib()}


def measure(run: Run) -> None:
    """Part 4 in the parent: sizes the arm, runs it and prints the decode table."""
    a = run.args
    s = run.fit("decode", lambda s: 2 * (2 * (DECODE_CELLS // s + CHUNK // s) * BYTES_PER_CELL + MODEL_OVERHEAD),
                a.scale)
    p = {**run.base(s), "cells": DECODE_CELLS // s, "new": a.new, "rounds": a.decode_rounds}
    t = time.perf_counter()
    res = run.child("decode", p)
    print(f"  decode arm: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    run.payload["decode"] = {"scale": s, "params": p, "raw": res}
    if res is None:
        return
    rows = []
    for layout in LAYOUTS:
        rs = res["raw"][layout]
        steps = [x for r in rs for x in r["step_s"]]
        cpu = [x for r in rs for x in r["step_cpu_s"]]
        rows.append([layout, 2 / statistics.median(steps), 2 / min(steps), statistics.median(steps) * 1e3,
                     statistics.median(cpu) * 1e3, statistics.median(r["turn_ttft_s"] for r in rs),
                     "/".join(sorted({str(c) for r in rs for c in r["num_cached_tokens"]}, key=int)),
                     res["kv_bytes"][layout] / GIB])
        if any(c < p["cells"] for r in rs for c in r["num_cached_tokens"]):
            run.note(f"ENGINE PROBLEM: a {layout} decode turn did not reuse its {p['cells']} cached cells")
    rows.append(["pool / reserved", *(rows[1][i] / rows[0][i] for i in (1, 2, 3, 4, 5)), "",
                 rows[1][7] / rows[0][7]])
    n_steps = sum(len(r["step_s"]) for r in res["raw"]["pool"])
    title = (f"4. two lanes decoding together: conversations of {p['cells']} SYNTHETIC cells each (beyond the "
             f"model's trained length 8192: speed only, the text is meaningless), each extended by a short turn "
             f"(prefilled for real), {a.new} new tokens per lane per turn, {a.decode_rounds} turns; pool sized as "
             f"the reserved K/V; both layouts in one process, stepped alternately; tok/s = 2 lanes / median "
             f"step ({n_steps} steps per layout), best = 2 / fastest step")
    run.tables["decode"] = print_table(
        title, ["layout", "decode tok/s", "best tok/s", "step ms", "step CPU ms", "turn TTFT s",
                "num_cached_tokens", "K/V GiB"], rows)
    # Where each lane's cells sit decides how attention reads them (runner/reads.py).
    tables = "; ".join(f"{layout} {res['raw'][layout][-1]['chunk_tables']}" for layout in LAYOUTS)
    print(f"chunk tables after the last turn: {tables}")
    run.tables["decode"] += f"\nchunk tables after the last turn: {tables}"

"""Part 6: bf16 against int8 K/V (`--kv int8`): pool capacity in conversations of a given
length, and decode tok/s at two context lengths (real prefills; both K/V dtypes' engines in
one process, stepped alternately, several rounds)."""

from __future__ import annotations

import statistics
import sys
import time
from typing import TYPE_CHECKING

from benchmarks.common import peak_rss_mib, print_table
from benchmarks.pool_parts import GIB, cells_label
from benchmarks.pool_parts.synthetic import random_tokens

if TYPE_CHECKING:
    from benchmarks.pool import Run

KV_DTYPES = ("bf16", "int8")
CONTEXTS = (1024, 4000)  # decode arm: prompt lengths (the model's trained length is 8192)
CAPACITY_LENGTHS = (1024, 4096, 8192, 32768)  # conversation lengths for the capacity table
CAPACITY_BUDGET = 4 * GIB  # the pool's K/V bytes in the capacity table


def arm_kv_int8(p: dict) -> dict:
    import torch

    from strata.config import EngineConfig
    from strata.engine.engine import Engine
    from strata.sampling import SamplingParams

    torch.set_num_threads(p["threads"])
    ctx = max(p["contexts"]) + p["new"] + 64
    chunk = p["chunk"]
    engines = {kv: Engine(EngineConfig(kv=kv, max_context=ctx, kv_chunk=chunk, kv_pool_tokens=2 * ctx + 2 * chunk,
                                       threads=p["threads"]), progress=False) for kv in KV_DTYPES}
    vocab = engines["bf16"].model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=p["new"], ignore_eos=True)
    raw: dict = {kv: {str(n): [] for n in p["contexts"]} for kv in KV_DTYPES}
    same: dict = {}
    for r in range(p["rounds"]):
        for n in p["contexts"]:
            prompt = random_tokens(n, 100 * r + n, vocab)
            state = {}
            for kv, e in engines.items():
                e._scheduler.clear_cache()
                state[kv] = {"id": e.submit(prompt, params), "steps": [], "out": [], "t0": time.perf_counter()}
            order = KV_DTYPES if r % 2 == 0 else KV_DTYPES[::-1]
            while any(e.has_work for e in engines.values()):
                for kv in order:
                    e, st = engines[kv], state[kv]
                    if not e.has_work:
                        continue
                    t = time.perf_counter()
                    outs = e.step()
                    dt = time.perf_counter() - t
                    if st["out"]:  # decode steps only: the first token came with the prefill
                        st["steps"].append(dt)
                    for o in outs:
                        st["out"].extend(o.new_token_ids)
            for kv in KV_DTYPES:
                raw[kv][str(n)].append({"round": r, "step_s": state[kv]["steps"],
                                        "decode_tok_s": 1 / statistics.median(state[kv]["steps"])})
            same[f"{n}/{r}"] = state["bf16"]["out"] == state["int8"]["out"]
            print(f"  kv_int8 round {r + 1}, {n} cells: " + ", ".join(
                f"{kv} {raw[kv][str(n)][-1]['decode_tok_s']:.1f} tok/s" for kv in KV_DTYPES), file=sys.stderr)
    return {"raw": raw, "same_tokens": same, "bytes_per_cell": {kv: e._kv.bytes_per_cell for kv, e in engines.items()},
            "kv_bytes": {kv: e._kv.num_bytes for kv, e in engines.items()}, "peak_rss_mib": peak_rss_mib()}


def measure(run: Run) -> None:
    a = run.args
    p = {"threads": a.threads, "chunk": 256, "contexts": list(CONTEXTS), "new": a.new * 2, "rounds": a.decode_rounds}
    res = run.child("kv_int8", p)
    run.payload["kv_int8"] = {"params": p, "raw": res}
    if res is None:
        return
    bpc = res["bytes_per_cell"]
    chunk = 4096  # the default --kv-chunk
    rows = []
    for kv in KV_DTYPES:
        chunks = CAPACITY_BUDGET // (bpc[kv] * chunk)
        rows.append([f"{kv} ({bpc[kv]:,} B/cell)", *(chunks // -(-n // chunk) for n in CAPACITY_LENGTHS)])
    rows.append(["int8 / bf16", *(rows[1][i] / rows[0][i] for i in range(1, len(CAPACITY_LENGTHS) + 1))])
    run.tables["kv_int8_capacity"] = print_table(
        f"6a. conversations a {CAPACITY_BUDGET / GIB:.0f} GiB K/V pool holds (--kv-chunk {chunk}; from the engines' "
        f"real bytes per cell, int8 scales included: {bpc['int8']:,} / {bpc['bf16']:,} = "
        f"{bpc['int8'] / bpc['bf16']:.3f})",
        ["K/V", *(f"{cells_label(n)} cells" for n in CAPACITY_LENGTHS)], rows)
    rows = []
    for n in p["contexts"]:
        med = {kv: statistics.median(x for r in res["raw"][kv][str(n)] for x in r["step_s"]) for kv in KV_DTYPES}
        rows.append([n, 1 / med["bf16"], 1 / med["int8"], med["bf16"] / med["int8"],
                     sum(v for k, v in res["same_tokens"].items() if k.startswith(f"{n}/")), p["rounds"]])
    run.tables["kv_int8_decode"] = print_table(
        f"6b. decode tok/s, 1 lane, bf16 compute, a random-token prompt of N cells (real prefill), {p['new']} new "
        f"tokens, {p['rounds']} rounds; both K/V dtypes in one process, stepped alternately; median step",
        ["context", "bf16 K/V tok/s", "int8 K/V tok/s", "int8 / bf16", "rounds with identical tokens", "rounds"],
        rows)

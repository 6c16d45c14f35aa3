"""The resident ring with sliding-window layer groups (docs/ring.md) on Gemma 3 270M: bytes streamed and decode tok/s.

Two arms, both pooled with `--kv-resident R` (R smaller than the conversation), both engines in
this process, rounds interleaved:
- one ring: `--kv-window-groups off`, one group of every layer: every layer's ring holds R cells
  and streams the rest of the conversation each step (a windowed layer reads only its window,
  but the pages are copied for every layer);
- per group: a ring per layer group: the full layers stream as before, the windowed layers read
  their window through a ring that holds it (window + step cells) and stream nothing.
The long context is SYNTHETIC K/V written through each group's table (Engine.restore, as
benchmarks/window.py); the turn and its decode are computed for real.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, cpu_name, print_table, write_json  # noqa: E402
from benchmarks.window import TURN, fill, gemma3_file  # noqa: E402

MIB = 1024 * 1024
ARMS = ("one ring", "per group")


def engine(model: str, arm: str, ctx: int, ring: int, threads: int, device: str):
    from strata.config import EngineConfig
    from strata.engine.engine import Engine

    cfg = EngineConfig(model=model, dtype="float32", kv="bf16", max_context=ctx, batch=0, kv_chunk=256,
                       kv_pool_tokens=2 * ctx, kv_window_groups=arm == "per group", kv_resident=ring,
                       kv_ring_adapt=False, prefill_chunk=512, spec="off", threads=threads, memory_guard_mib=512,
                       devices=(device,))
    return Engine(cfg, progress=False)


def restore(e, base: list[int]) -> None:
    """The synthetic conversation, written into the pool; the rings drop any copy of those cells."""
    kv, c = e._kv, e._kv.chunk_size
    conv = e.restore(base, [0])
    fill(e, conv.table, len(base))
    for g, ids in enumerate((conv.table.chunk_ids, *(w.chunk_ids for w in conv.table.windows))):
        for cid in ids:
            if cid is not None:
                kv.cells_written(cid * c, c, g)


def one_round(e, base: list[int], turn: list[int], new: int) -> dict:
    from strata.sampling import SamplingParams

    e._scheduler.clear_cache()
    restore(e, base)
    rid = e.submit(base + turn, SamplingParams(temperature=0, max_tokens=new, ignore_eos=True))
    steps, out, first = [], [], None
    while e.has_work:
        ts = time.perf_counter()
        got = [o for o in e.step() if o.request_id == rid and o.new_token_ids]
        if got and first is None:
            first = e._ring.stats()  # decode starts here: its bytes are counted from now
        elif got:
            steps.append(time.perf_counter() - ts)
        out += [t for o in got for t in o.new_token_ids]
    last = e._ring.stats()
    tokens = len(steps)
    groups = [{"window": g["window"], "layers": g["layers"], "arena_cells": g["budget_cells"],
               "mib_per_tok": (g["bytes_streamed"] - f["bytes_streamed"]) / tokens / MIB}
              for g, f in zip(last["groups"], first["groups"])]
    return {"decode_tok_s": 1 / statistics.median(steps),
            "mib_per_tok": (last["bytes_streamed"] - first["bytes_streamed"]) / tokens / MIB,
            "groups": groups, "tokens": out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--ring", type=int, default=2048, help="--kv-resident, cells a lane keeps per layer")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="the layers' device (cuda: the pool pinned in host memory)")
    add_quick_and_out(p, "2K cells, a ring of 1024, one round, 4 new tokens")
    args = p.parse_args()
    ctx, ring, rounds, new = (2048, 1024, 1, 4) if args.quick else (args.ctx, args.ring, args.rounds, args.new)
    model = gemma3_file()
    engines = {arm: engine(model, arm, ctx + 1024, ring, args.threads, args.device) for arm in ARMS}
    turn = engines[ARMS[0]].tokenizer.encode(TURN, add_special_tokens=False)
    base = [100 + (i * 7919) % 20000 for i in range(ctx)]
    raw = {arm: [] for arm in ARMS}
    for r in range(rounds):
        for arm in ARMS if r % 2 == 0 else ARMS[::-1]:
            raw[arm].append(one_round(engines[arm], base, turn, new))
    med = {arm: {k: statistics.median(x[k] for x in rows) for k in ("decode_tok_s", "mib_per_tok")}
           for arm, rows in raw.items()}
    same = all(x["tokens"] == raw[ARMS[0]][0]["tokens"] for rows in raw.values() for x in rows)
    print_table(f"{ctx} synthetic cells + a real turn, ring {ring} cells, median of {rounds} round(s), {cpu_name()}",
                ["arm", "decode tok/s", "MiB streamed/tok"],
                [(arm, med[arm]["decode_tok_s"], med[arm]["mib_per_tok"]) for arm in ARMS])
    print_table("per layer group (first round)", ["arm", "window", "layers", "arena cells", "MiB streamed/tok"],
                [(arm, g["window"] or "full", g["layers"], g["arena_cells"], g["mib_per_tok"])
                 for arm in ARMS for g in raw[arm][0]["groups"]])
    one, grouped = med[ARMS[0]], med[ARMS[1]]
    print(f"per group / one ring: {grouped['decode_tok_s'] / one['decode_tok_s']:.2f}x tok/s, "
          f"{grouped['mib_per_tok'] / one['mib_per_tok']:.2f}x bytes; same greedy tokens: {same}")
    os.makedirs(args.out, exist_ok=True)
    name = "ring_window-quick" if args.quick else "ring_window"
    path = write_json(f"{name}.json", {"cpu": cpu_name(), "device": args.device, "argv": sys.argv, "ctx": ctx, "ring": ring, "raw": raw,
                                       "median": med, "same_tokens": same, "synthetic_kv": True}, args.out)
    print(f"wrote {path}; the long context holds SYNTHETIC K/V (the turn is computed for real)")


if __name__ == "__main__":
    main()

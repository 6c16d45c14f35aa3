"""The shared KV pool against the reserved layout: lane moves, idle memory, cached follow-ups, decode.

Reproduces, on this machine and with the default model's K/V geometry (SmolLM2-135M:
30 layers, 3 K/V heads of 64, bf16 = 22.5 KiB per token), the claims the pool was
proposed with (seed thread #3351), both layouts side by side in one run:

1. move: the time `Engine.move` takes to move an idle conversation between lanes, against
   its length (1K .. 256K cells). Reserved copies every cell; the pool hands the chunk
   table over. Conversations are held with `Engine.restore` and their K/V is SYNTHETIC
   (written straight into the storage through the chunk table). Targets: the swap under
   1 ms and flat in length, copy / swap > 1000x at 256K.
2. memory: two lanes at --max-context 262144, each layout in its own process: committed
   K/V bytes, RSS and the MemAvailable drop after start (the pool at its smallest valid
   --kv-pool-tokens, which holds one --max-context conversation). Then how many ~104K-cell
   conversations a pool as large as the reserved layout holds: computed from chunk counts,
   verified by restoring that many (one per lane, synthetic K/V, a short turn appended to
   each and decoded together) and checking that one more makes the oldest give way.
3. ttft: time to first token of a short question appended to a cached ~8K-token
   conversation against a cold prefill of the same tokens, on the real model at its
   trained length (real prefills, no synthetic K/V). Both layouts' engines in one
   process, interleaved request by request (see `arm_ttft`).
4. decode: two conversations of 32K SYNTHETIC cells each (beyond the model's trained length
   of 8192: allowed for measurement, quality is meaningless), each extended by a short turn
   (the turn is prefilled for real on top of the synthetic K/V), both lanes decoding
   together; tok/s per layout and pool / reserved. Both layouts' engines in one process,
   stepped alternately.

    python benchmarks/pool.py [--quick] [--scale S] [--only move,memory,ttft,decode]

`--scale S` divides every length and size (contexts, chunk, pool) by S; `--quick` is
`--scale 16` (unless given) with fewer repetitions and rounds. Before every arm the
script compares what the arm will commit with MemAvailable and, when it is short, runs
that part at a larger scale and says so. Arms run one at a time, each in a fresh
interpreter; the TTFT and decode arms hold both layouts' engines in one interpreter and
interleave them, which keeps the comparison fair on a machine other processes share
(with 2 torch threads on 2 cores, a busy neighbour makes every parallel region wait for
a time slice: timings swing several-fold; each result keeps the CPU load it started
under, and the move and decode tables add the best run next to the median).
Raw numbers and tables go to benchmarks/results/pool.json (pool-quick.json for
--quick), and a PNG of move time against length when matplotlib is importable.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import (
    RESULTS_DIR,
    available_mib,
    peak_rss_mib,
    print_table,
    rss_mib,
    run_arm,
    wait_for_quiet,
    write_json,
)

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
BYTES_PER_CELL = 30 * 2 * 3 * 64 * 2  # SmolLM2-135M, bf16: 22.5 KiB; the children report the real value
MODEL_OVERHEAD = int(1.6 * GIB)  # interpreter + torch + model weights + rotary tables (measured ~1.3 GiB)
HEADROOM = 2 * GIB  # left free for the rest of the machine
MOVE_LENGTHS = (1024, 8192, 32768, 131072, 262144)
MOVE_CONTEXT = 262144
CHUNK = 4096
CAPACITY_CELLS = 104_000  # "three conversations of about 104k" in the seed
TTFT_CONTEXT = 8192  # SmolLM2's trained length
DECODE_CELLS = 32768
LAYOUTS = ("reserved", "pool")

DOC = (
    "Entry {i}. The lighthouse keeper climbed the spiral stairs each evening, counting the steps as "
    "his father had taught him. On day {i} he logged {w} ships beyond the reef, the wind from the "
    "{d}, and {g} gulls on the rocks below; the lamp burned {o} litres of oil before dawn.\n"
)
QUESTIONS = (
    "\nQuestion: How many ships did the keeper log on the last day?\nAnswer:",
    "\nQuestion: Which way did the wind blow that evening?\nAnswer:",
    "\nQuestion: How much oil did the lamp burn overnight?\nAnswer:",
    "\nQuestion: What did the keeper count on the stairs?\nAnswer:",
    "\nQuestion: Who taught the keeper to count the steps?\nAnswer:",
)
ANSWER = " I will check the log and tell you.\n"
TURN = "\nUser: Summarise the log in one sentence.\nAssistant:"


# ---- helpers used by the children ------------------------------------------------------------
def make_engine(p: dict, layout: str, max_context: int, batch: int, pool_tokens: int | None, prefill_chunk: int):
    import torch

    from strata.config import EngineConfig
    from strata.engine.engine import Engine

    torch.set_num_threads(p["threads"])
    cfg = EngineConfig(
        max_context=max_context,
        batch=batch,
        kv_chunk=p["chunk"],
        kv_pool_tokens=pool_tokens if layout == "pool" else None,
        prefill_chunk=prefill_chunk,
        threads=p["threads"],
    )
    return Engine(cfg, progress=False)


class Synthetic:
    """Synthetic K/V written straight into the storage through a conversation's chunk table.

    Chunk j of layer l gets a window of one random block at an offset that depends on (j, l),
    so every chunk of a conversation holds different values and a move that lands cells in
    the wrong chunk (or not at all) is caught by `check`.
    """

    SPREAD = 256

    def __init__(self, kv, seed: int):
        import torch

        g = torch.Generator().manual_seed(seed)
        heads, _, dim = kv.k[0].shape
        self.kv = kv
        self.block = torch.randn(heads, kv.chunk_size + self.SPREAD, dim, generator=g).to(kv.dtype)

    def _window(self, j: int, layer: int, is_v: bool, n: int):
        off = (j * 31 + layer * 7 + (self.SPREAD // 2 if is_v else 0)) % self.SPREAD
        return self.block[:, off : off + n]

    def _spans(self, table, num_cells: int):
        c = self.kv.chunk_size
        for j, cid in enumerate(table.chunk_ids):
            n = min(c, num_cells - j * c)
            if n <= 0:
                break
            yield j, slice(cid * c, cid * c + n), n

    def fill(self, table, num_cells: int) -> float:
        t = time.perf_counter()
        for j, cells, n in self._spans(table, num_cells):
            for layer in range(self.kv.num_layers):
                self.kv.k[layer][:, cells].copy_(self._window(j, layer, False, n))
                self.kv.v[layer][:, cells].copy_(self._window(j, layer, True, n))
        return time.perf_counter() - t

    def check(self, table, num_cells: int) -> bool:
        """First, middle and last chunk, first and last layer, K and V: exactly what was written."""
        import torch

        spans = list(self._spans(table, num_cells))
        picks = {0, len(spans) // 2, len(spans) - 1}
        for j, cells, n in (spans[i] for i in sorted(picks)):
            for layer in {0, self.kv.num_layers - 1}:
                if not torch.equal(self.kv.k[layer][:, cells], self._window(j, layer, False, n)):
                    return False
                if not torch.equal(self.kv.v[layer][:, cells], self._window(j, layer, True, n)):
                    return False
        return True


def random_tokens(n: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, vocab) for _ in range(n)]


def memory_now() -> dict:
    return {"rss_mib": rss_mib(), "available_mib": available_mib()}


# ---- arms (each runs in its own interpreter) -----------------------------------------------
def arm_move(p: dict) -> dict:
    """Idle memory right after start, then lane moves at every length (parts 1 and 2)."""
    layout = p["layout"]
    t0 = time.perf_counter()
    engine = make_engine(p, layout, p["max_context"], 1, p["max_context"], 256)
    start = {"start_s": time.perf_counter() - t0, "kv_bytes": engine.kv.num_bytes,
             "num_chunks": engine.layout.pool.num_total, **memory_now()}
    kv = engine.kv
    vocab = engine.model_config.vocab_size
    sched = engine.scheduler
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


def timed_request(engine, prompt: list[int]) -> dict:
    """One greedy token for `prompt`: time (wall and process CPU) from submission to the first token."""
    from strata.sampling import SamplingParams

    c, t = time.process_time(), time.perf_counter()
    rid = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=1))
    while True:
        for o in engine.step():
            if o.request_id == rid and o.new_token_ids:
                ttft, cpu = time.perf_counter() - t, time.process_time() - c
                while engine.has_work:
                    engine.step()
                return {"ttft_s": ttft, "cpu_s": cpu, "tokens": len(prompt), "num_prompt_tokens": o.num_prompt_tokens,
                        "num_cached_tokens": o.num_cached_tokens, "first_token": o.new_token_ids[0]}


def arm_ttft(p: dict) -> dict:
    """Cached follow-ups vs cold prefills, both layouts' engines in this process, interleaved request by request.

    A chain X0, X1 .. Xn: X(k+1) is X(k) plus an answer and a short question. cold(X0) builds
    the first cache; cached(X1) .. cached(Xn) each extend the previous conversation (cheap, so
    there are several); then the cache is cleared and cold(Xn) prefills exactly the tokens of
    the last cached request. Cold prefills at ~8K tokens differ by well under 1 % between X0
    and Xn, so the cold median is over both.
    """
    ctx, n = p["context"], p["rounds"]
    engines = {layout: make_engine(p, layout, ctx, 1, 2 * ctx, p["prefill_chunk"]) for layout in LAYOUTS}
    tok = engines["pool"].tokenizer
    q = [tok.encode(x, add_special_tokens=False) for x in QUESTIONS]
    answer = tok.encode(ANSWER, add_special_tokens=False)
    room = sum(len(q[k % len(q)]) + len(answer) for k in range(n + 1)) + 8
    rng = random.Random(7)
    text = "".join(DOC.format(i=i, w=rng.randrange(2, 40), d=rng.choice("NESW"), g=rng.randrange(10, 900),
                              o=rng.randrange(3, 30)) for i in range(ctx // 40 + 10))
    doc = tok.encode(text)[: ctx - room]
    chain = [doc + q[0]]
    for k in range(1, n + 1):
        chain.append(chain[-1] + answer + q[k % len(q)])
    assert len(chain[-1]) < ctx

    for e in engines.values():  # warm-up: a short cold prompt and a follow-up (the masked, cached path)
        timed_request(e, doc[:48])
        timed_request(e, doc[:48] + q[1])
        e.scheduler.clear_cache()
    raw: dict = {layout: {"cold": [], "cached": []} for layout in LAYOUTS}

    def each(kind: str, prompt: list[int], clear: bool, k: int) -> None:
        order = LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]  # alternate who goes first
        for layout in order:
            if clear:
                engines[layout].scheduler.clear_cache()
            r = timed_request(engines[layout], prompt)
            r["chain_index"] = k
            raw[layout][kind].append(r)
            print(f"  ttft {layout} {kind} X{k} ({len(prompt)} tokens, {r['num_cached_tokens']} cached): "
                  f"{r['ttft_s']:.3f} s", file=sys.stderr)

    each("cold", chain[0], False, 0)
    for k in range(1, n + 1):
        each("cached", chain[k], False, k)
    each("cold", chain[n], True, n + 1)
    raw_chain = [len(c) for c in chain]
    return {"context": ctx, "chain_lengths": raw_chain, "raw": raw,
            "kv_bytes": {k: e.kv.num_bytes for k, e in engines.items()}, "peak_rss_mib": peak_rss_mib()}


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
        synth = Synthetic(e.kv, seed=3)
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
            ids = [e.add_request(pr + turn, params) for pr in prompts[layout]]
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
                "chunk_tables": [list(c.table.chunk_ids) for c in e.scheduler.cache],
            })
            print(f"  decode round {r + 1} {layout}: {2 / med:.2f} tok/s (median step {med * 1e3:.0f} ms), "
                  f"turn TTFT {st['ttft_s']:.2f} s", file=sys.stderr)
    same = all(a["num_output_tokens"] == b["num_output_tokens"] for a, b in zip(raw["reserved"], raw["pool"]))
    return {"raw": raw, "fill_s": fill_s, "same_lengths": same,
            "kv_bytes": {k: e.kv.num_bytes for k, e in engines.items()}, "peak_rss_mib": peak_rss_mib()}


ALL_PARTS = {"move", "memory", "ttft", "decode"}
ARMS = {"move": arm_move, "capacity": arm_capacity, "ttft": arm_ttft, "decode": arm_decode}


# ---- the parent: memory checks, rounds, tables ---------------------------------------------
class Run:
    def __init__(self, args):
        self.args = args
        self.notes: list[str] = []
        self.payload: dict = {"args": vars(args), "notes": self.notes, "bytes_per_cell_assumed": BYTES_PER_CELL}
        self.tables: dict[str, str] = {}
        self.busy_starts = 0

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"note: {text}", file=sys.stderr)

    def fit(self, part: str, need_at, scale: int) -> int:
        """The smallest scale >= `scale` (doubling) at which `need_at(scale)` bytes fit in MemAvailable."""
        avail = available_mib() * MIB
        s = scale
        while need_at(s) + HEADROOM > avail and s < 4096:
            s *= 2
        if s != scale:
            self.note(f"{part}: needs {need_at(scale) / GIB:.2f} GiB at scale {scale} but only "
                      f"{avail / GIB:.2f} GiB is available (keeping {HEADROOM / GIB:.0f} GiB free): ran at "
                      f"scale {s} instead")
        print(f"[{part}] MemAvailable {avail / GIB:.2f} GiB, this arm needs about "
              f"{need_at(s) / GIB:.2f} GiB (scale {s})", file=sys.stderr)
        return s

    def enough(self, what: str, need: int) -> bool:
        """Whether `need` bytes fit in MemAvailable now (checked before every big arm); notes a skip."""
        avail = available_mib() * MIB
        if need + HEADROOM <= avail:
            return True
        self.note(f"{what}: skipped, needs {need / GIB:.2f} GiB and {avail / GIB:.2f} GiB is available")
        return False

    def wait_quiet(self) -> dict:
        """Before each arm, waits (up to --quiet-wait s) for other processes to leave the CPUs mostly idle;
        what the CPUs were doing is kept with the arm's result, and arms started busy are counted."""
        quiet = wait_for_quiet(self.args.quiet_wait, self.args.quiet_cpu)
        if not quiet["quiet"]:
            self.busy_starts += 1
        return quiet

    def child(self, arm: str, params: dict) -> dict | None:
        quiet = self.wait_quiet()
        try:
            res = run_arm(__file__, arm, ["--params", json.dumps(params)], timeout=self.args.timeout)
        except Exception as exc:  # noqa: BLE001 - a failed arm (memory, a bug) is reported, the rest still runs
            self.note(f"arm {arm} {params.get('layout', '')} failed: {str(exc)[-1500:]}")
            return None
        res["machine_at_start"] = quiet
        res["loadavg_1m_at_end"] = os.getloadavg()[0]
        return res

    def base(self, scale: int) -> dict:
        return {"threads": self.args.threads, "chunk": max(16, CHUNK // scale), "scale": scale}

    # -- parts 1 and 2a: moves and idle memory ----------------------------------------------------
    def move_and_memory(self) -> None:
        a = self.args
        s = self.fit("move/memory", lambda s: 2 * (MOVE_CONTEXT // s) * BYTES_PER_CELL + MODEL_OVERHEAD, a.scale)
        p = {**self.base(s), "max_context": MOVE_CONTEXT // s, "lengths": [n // s for n in MOVE_LENGTHS],
             "reps": a.reps}
        raw: dict[str, list[dict]] = {layout: [] for layout in LAYOUTS}
        for r in range(a.rounds):
            for layout in LAYOUTS:
                need = (2 if layout == "reserved" else 1) * p["max_context"] * BYTES_PER_CELL + MODEL_OVERHEAD
                if not self.enough(f"move/memory {layout} round {r + 1}", need):
                    continue
                before = available_mib()
                t = time.perf_counter()
                res = self.child("move", {**p, "layout": layout})
                if res is not None:
                    res["start"]["available_before_mib"] = before
                    raw[layout].append(res)
                print(f"  round {r + 1}/{a.rounds} move {layout}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
        self.payload["move"] = {"scale": s, "params": p, "raw": raw}
        if not all(raw.values()):
            self.note("move/memory: a layout has no result; its tables are left out")
            return
        bpc = raw["pool"][0]["bytes_per_cell"]
        if bpc != BYTES_PER_CELL:
            self.note(f"the model's K/V is {bpc} bytes per cell, not the assumed {BYTES_PER_CELL}")
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
            rows.append([_cells(n), n * bpc / MIB, med["reserved"], best["reserved"], copied / MIB,
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
        self.tables["move"] = print_table(
            title, ["cells", "K/V MiB", "reserved copy ms", "best ms", "copied MiB", "pool swap us", "best us",
                    "pool copied B", "copy / swap", "synthetic fill s"], rows)
        top = rows[-1]
        swap_max_ms = max(curve["pool_ms"])
        verdict = (f"swap max {swap_max_ms * 1e3:.1f} us over all lengths (target < 1 ms: "
                   f"{'met' if swap_max_ms < 1 else 'MISSED'}); swap at longest / shortest "
                   f"{curve['pool_ms'][-1] / curve['pool_ms'][0]:.2f} (flat = ~1); copy / swap at "
                   f"{top[0]} {top[8]:,.0f}x (target > 1000x: {'met' if top[8] > 1000 else 'MISSED'})")
        print(verdict)
        self.tables["move"] += "\n" + verdict
        self.payload["move"].update({"curve": curve, "problems": problems, "verdict": verdict})
        for pr in problems:
            self.note(f"ENGINE PROBLEM: {pr}")
        self.plot(curve, p, bpc)

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
        self.tables["memory"] = print_table(
            title, ["layout", "--kv-pool-tokens", "chunks", "committed K/V GiB", "RSS GiB",
                    "MemAvailable drop GiB", "start s"], rows)
        self.payload["move"]["memory_rows"] = rows

    # -- part 2b: how many ~104K conversations the reserved layout's memory holds as a pool -------
    def capacity(self) -> None:
        a = self.args
        s = self.fit("capacity", lambda s: 2 * (MOVE_CONTEXT // s) * BYTES_PER_CELL + MODEL_OVERHEAD + 512 * MIB,
                     a.scale)
        chunk = max(16, CHUNK // s)
        ctx = MOVE_CONTEXT // s
        per_lane = -(-ctx // chunk)
        reserved_chunks = 2 * per_lane
        cells = CAPACITY_CELLS // s
        per_conv = -(-(cells + 64) // chunk)  # room for the appended turn and its answer
        n_conv = reserved_chunks // per_conv
        p = {**self.base(s), "max_context": ctx, "pool_tokens": reserved_chunks * chunk, "cells": cells,
             "num_conversations": n_conv, "new": a.capacity_new}
        res = self.child("capacity", p)
        self.payload["capacity"] = {"scale": s, "params": p, "raw": res}
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
        title = (f"2b. ~{_cells(cells)}-cell conversations ({cells} cells) held in the reserved layout's K/V "
                 f"memory (2 lanes x --max-context {ctx}, --kv-chunk {chunk}); K/V SYNTHETIC. Verified = "
                 f"restored {n_conv} (one per lane), each extended by a {a.capacity_new}-token turn decoded "
                 f"together (all reused {cells} cached cells), and one more made the oldest give way")
        self.tables["capacity"] = print_table(
            title, ["layout", "chunks", "K/V GiB", "chunks per conversation", "conversations held", "verified",
                    "turns s"], rows)
        extra = (f"one more conversation: evictions {res['one_more']['num_evictions']}, refused "
                 f"{res['one_more']['refused']}, held after {res['one_more']['num_conversations']}; "
                 f"RSS with {n_conv} held {res['held']['rss_mib'] / KIB:.2f} GiB")
        print(extra)
        self.tables["capacity"] += "\n" + extra
        if not ok:
            self.note(f"ENGINE PROBLEM? capacity check did not verify: {json.dumps(res)[:800]}")

    # -- part 3: TTFT of a cached follow-up ------------------------------------------------------
    def ttft(self) -> None:
        a = self.args
        s = self.fit("ttft", lambda s: 2 * (2 * 2 * (TTFT_CONTEXT // s) * BYTES_PER_CELL + MODEL_OVERHEAD), a.scale)
        ctx = max(128, TTFT_CONTEXT // s)
        p = {**self.base(s), "context": ctx, "prefill_chunk": a.prefill_chunk or ctx, "rounds": a.ttft_rounds}
        t = time.perf_counter()
        res = self.child("ttft", p)
        print(f"  ttft arm: {time.perf_counter() - t:.0f} s", file=sys.stderr)
        self.payload["ttft"] = {"scale": s, "params": p, "raw": res}
        if res is None:
            return
        rows = []
        firsts = {}
        for layout in LAYOUTS:
            cached, cold = res["raw"][layout]["cached"], res["raw"][layout]["cold"]
            c_ms = statistics.median(r["ttft_s"] for r in cached) * 1e3
            k_s = statistics.median(r["ttft_s"] for r in cold)
            last_c, last_k = cached[-1], cold[-1]  # the same tokens: X_n cached, then X_n cold
            firsts[layout] = [r["first_token"] for r in cached + cold]
            rows.append([layout, last_k["tokens"], k_s, c_ms, 100 * c_ms / 1e3 / k_s,
                         100 * last_c["ttft_s"] / last_k["ttft_s"], min(r["ttft_s"] for r in cached) * 1e3,
                         "/".join(sorted({str(r["num_cached_tokens"]) for r in cached}, key=int)),
                         "/".join(sorted({str(r["num_prompt_tokens"] - r["num_cached_tokens"]) for r in cached})),
                         "yes" if last_c["first_token"] == last_k["first_token"] else "NO"])
            if any(r["num_cached_tokens"] == 0 for r in cached):
                self.note(f"ENGINE PROBLEM: a {layout} follow-up reused no cached tokens")
        rows.append(["pool / reserved", "", rows[1][2] / rows[0][2], rows[1][3] / rows[0][3], "", "",
                     rows[1][6] / rows[0][6], "", "", ""])
        same_layouts = firsts["reserved"] == firsts["pool"]
        n_c, n_k = len(res["raw"]["pool"]["cached"]), len(res["raw"]["pool"]["cold"])
        title = (f"3. TTFT of a short question appended to a cached conversation vs a cold prefill: real model, real "
                 f"prefills, --max-context {ctx} (trained length), --prefill-chunk {p['prefill_chunk']}, {a.threads} "
                 f"threads; both layouts in one process, interleaved request by request; medians of {n_c} cached "
                 f"follow-ups (a chain, each extending the last) and {n_k} cold prefills (the chain's first and "
                 f"last prompt); 'last pair' = the last follow-up vs a cold prefill of exactly its tokens")
        self.tables["ttft"] = print_table(
            title, ["layout", "prompt tokens", "cold TTFT s", "cached TTFT ms", "cached / cold %",
                    "last pair %", "cached best ms", "num_cached_tokens", "prefilled", "same first token"], rows)
        if s != 1:
            self.note(f"ttft at scale {s}: the appended question is not scaled (~{rows[0][8]} tokens against a "
                      f"{ctx}-token context), so cached / cold is not comparable with the 5 % target")
        verdict = ("target cached / cold < 5 %: " + ", ".join(
            f"{r[0]} {'met' if r[4] < 5 else 'MISSED'}" for r in rows[:2])
            + f"; greedy first tokens identical across layouts: {'yes' if same_layouts else 'NO'}")
        print(verdict)
        self.tables["ttft"] += "\n" + verdict
        if not same_layouts:
            self.note("greedy first tokens differ between the layouts (DESIGN.md says they must not)")

    # -- part 4: two long lanes decoding appended turns ------------------------------------------
    def decode(self) -> None:
        a = self.args
        s = self.fit("decode", lambda s: 2 * (2 * (DECODE_CELLS // s + CHUNK // s) * BYTES_PER_CELL + MODEL_OVERHEAD),
                     a.scale)
        p = {**self.base(s), "cells": DECODE_CELLS // s, "new": a.new, "rounds": a.decode_rounds}
        t = time.perf_counter()
        res = self.child("decode", p)
        print(f"  decode arm: {time.perf_counter() - t:.0f} s", file=sys.stderr)
        self.payload["decode"] = {"scale": s, "params": p, "raw": res}
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
                self.note(f"ENGINE PROBLEM: a {layout} decode turn did not reuse its {p['cells']} cached cells")
        rows.append(["pool / reserved", *(rows[1][i] / rows[0][i] for i in (1, 2, 3, 4, 5)), "",
                     rows[1][7] / rows[0][7]])
        n_steps = sum(len(r["step_s"]) for r in res["raw"]["pool"])
        title = (f"4. two lanes decoding together: conversations of {p['cells']} SYNTHETIC cells each (beyond the "
                 f"model's trained length 8192: speed only, the text is meaningless), each extended by a short turn "
                 f"(prefilled for real), {a.new} new tokens per lane per turn, {a.decode_rounds} turns; pool sized as "
                 f"the reserved K/V; both layouts in one process, stepped alternately; tok/s = 2 lanes / median "
                 f"step ({n_steps} steps per layout), best = 2 / fastest step")
        self.tables["decode"] = print_table(
            title, ["layout", "decode tok/s", "best tok/s", "step ms", "step CPU ms", "turn TTFT s",
                    "num_cached_tokens", "K/V GiB"], rows)

    def plot(self, curve: dict, p: dict, bpc: int) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            self.note("matplotlib is not installed in the venv: the move-time plot is skipped "
                      "(the curve is in pool.json under move.curve)")
            return
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.loglog(curve["cells"], curve["reserved_ms"], "o-", label="reserved: copy")
        ax.loglog(curve["cells"], curve["pool_ms"], "s-", label="pool: table swap")
        ax.axhline(1.0, color="grey", ls=":", lw=1, label="1 ms")
        ax.set_xlabel("conversation length (cells)")
        ax.set_ylabel("Engine.move time (ms, median)")
        ax.set_title(f"lane move, {bpc / KIB:.1f} KiB/cell, chunk {p['chunk']} (synthetic K/V)")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        path = os.path.join(RESULTS_DIR, "pool-move-quick.png" if self.args.quick else "pool-move.png")
        os.makedirs(RESULTS_DIR, exist_ok=True)
        fig.savefig(path, dpi=120, bbox_inches="tight")
        self.payload["plot"] = path
        print(f"plot: {path}")


def _cells(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", choices=sorted(ARMS))
    p.add_argument("--params", help="(children) the arm's parameters as JSON")
    p.add_argument("--quick", action="store_true", help="scale 16 (unless --scale), fewer repetitions and rounds")
    p.add_argument("--scale", type=int, help="divide every length and size by this (default 1; 16 with --quick)")
    p.add_argument("--only", default="move,memory,ttft,decode", help="parts to run (move includes idle memory)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--reps", type=int, help="moves per length per process (default 7; 3 with --quick)")
    p.add_argument("--rounds", type=int, help="move/memory processes per layout (default 3; 1 with --quick)")
    p.add_argument("--ttft-rounds", type=int, help="cached follow-ups per layout (default 5; 2 with --quick)")
    p.add_argument("--prefill-chunk", type=int, help="TTFT arm's --prefill-chunk (default: the whole context)")
    p.add_argument("--decode-rounds", type=int, help="turns each decode lane takes (default 3; 2 with --quick)")
    p.add_argument("--new", type=int, help="new tokens per lane in the decode arm (default 16; 8 with --quick)")
    p.add_argument("--capacity-new", type=int, default=2, help="tokens each held conversation decodes in 2b")
    p.add_argument("--quiet-wait", type=float, help="seconds to wait before each arm for the CPUs to be "
                   "mostly idle (default 180; 30 with --quick)")
    p.add_argument("--quiet-cpu", type=float, default=25.0, help="host CPU %% counted as mostly idle")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one arm may run")
    args = p.parse_args()
    if args.arm:
        print(json.dumps(ARMS[args.arm](json.loads(args.params))))
        return
    q = args.quick
    args.scale = args.scale or (16 if q else 1)
    args.reps = args.reps or (3 if q else 7)
    args.rounds = args.rounds or (1 if q else 3)
    args.ttft_rounds = args.ttft_rounds or (2 if q else 5)
    args.decode_rounds = args.decode_rounds or (2 if q else 3)
    args.new = args.new or (8 if q else 16)
    args.quiet_wait = args.quiet_wait if args.quiet_wait is not None else (30 if q else 180)
    parts = {x.strip() for x in args.only.split(",") if x.strip()}
    if parts - ALL_PARTS:
        p.error(f"--only: unknown part(s) {', '.join(sorted(parts - ALL_PARTS))}")

    run = Run(args)
    import psutil

    vm = psutil.virtual_memory()
    run.payload["machine"] = {"cpus": os.cpu_count(), "threads": args.threads, "mem_total_gib": vm.total / GIB,
                              "mem_available_gib_at_start": vm.available / GIB}
    print(f"machine: {os.cpu_count()} CPUs, {vm.total / GIB:.1f} GiB RAM, {vm.available / GIB:.1f} GiB available; "
          f"scale {args.scale}{' (quick)' if q else ''}", file=sys.stderr)
    if args.scale != 1:
        run.note(f"scaled run: every length and size is divided by {args.scale} "
                 f"(kv-chunk {max(16, CHUNK // args.scale)})")
    run.note("moves, idle memory, capacity and decode use SYNTHETIC K/V written into the storage through each "
             "conversation's chunk table (Engine.restore); only the TTFT arm prefills for real")
    t0 = time.perf_counter()
    if parts & {"move", "memory"}:
        run.move_and_memory()
    if "memory" in parts:
        run.capacity()
    if "ttft" in parts:
        run.ttft()
    if "decode" in parts:
        run.decode()
    if run.busy_starts:
        run.note(f"{run.busy_starts} arm(s) started while other processes kept the CPUs over {args.quiet_cpu:.0f} % "
                 f"busy (after waiting up to {args.quiet_wait:.0f} s): their timings are inflated by contention; "
                 f"see machine_at_start / loadavg_1m_at_end in each raw result")
    run.payload["tables"] = run.tables
    run.payload["seconds"] = time.perf_counter() - t0
    name = "pool-quick.json" if q else "pool.json"
    if parts != ALL_PARTS:  # a partial run updates its parts in the last full file, keeping the others
        try:
            with open(os.path.join(RESULTS_DIR, name)) as f:
                old = json.load(f)
        except (OSError, ValueError):
            old = None
        if old is not None:
            for key in ("move", "capacity", "ttft", "decode"):
                if key not in run.payload and key in old:
                    run.payload[key] = old[key]
            run.payload["tables"] = {**old.get("tables", {}), **run.tables}
            run.payload["notes"] = run.notes + [f"(kept from an earlier run) {n}" for n in old.get("notes", [])
                                                if n not in run.notes]
    path = write_json(name, run.payload)
    if run.notes:
        print("\nnotes:\n" + "\n".join(f"- {n}" for n in run.notes))
    print(f"raw numbers: {path} ({run.payload['seconds']:.0f} s)")


if __name__ == "__main__":
    main()

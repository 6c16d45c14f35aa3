"""Part 3: time to first token of a short question appended to a cached conversation, against a
cold prefill of the same tokens; real model, real prefills, both layouts in one process."""

from __future__ import annotations

import random
import statistics
import sys
import time
from typing import TYPE_CHECKING

from benchmarks.common import peak_rss_mib, print_table
from benchmarks.pool_parts import BYTES_PER_CELL, LAYOUTS, MODEL_OVERHEAD
from benchmarks.pool_parts.synthetic import make_engine

if TYPE_CHECKING:
    from benchmarks.pool import Run

TTFT_CONTEXT = 8192  # SmolLM2's trained length

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


def timed_request(engine, prompt: list[int]) -> dict:
    """One greedy token for `prompt`: time (wall and process CPU) from submission to the first token."""
    from strata.sampling import SamplingParams

    c, t = time.process_time(), time.perf_counter()
    rid = engine.submit(prompt, SamplingParams(temperature=0, max_tokens=1))
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
        e._scheduler.clear_cache()
    raw: dict = {layout: {"cold": [], "cached": []} for layout in LAYOUTS}

    def each(kind: str, prompt: list[int], clear: bool, k: int) -> None:
        order = LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]  # alternate who goes first
        for layout in order:
            if clear:
                engines[layout]._scheduler.clear_cache()
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
            "kv_bytes": {k: e._kv.num_bytes for k, e in engines.items()}, "peak_rss_mib": peak_rss_mib()}


def measure(run: Run) -> None:
    """Part 3 in the parent: sizes the arm, runs it and prints the TTFT table and verdict."""
    a = run.args
    s = run.fit("ttft", lambda s: 2 * (2 * 2 * (TTFT_CONTEXT // s) * BYTES_PER_CELL + MODEL_OVERHEAD), a.scale)
    ctx = max(128, TTFT_CONTEXT // s)
    p = {**run.base(s), "context": ctx, "prefill_chunk": a.prefill_chunk or ctx, "rounds": a.ttft_rounds}
    t = time.perf_counter()
    res = run.child("ttft", p)
    print(f"  ttft arm: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    run.payload["ttft"] = {"scale": s, "params": p, "raw": res}
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
            run.note(f"ENGINE PROBLEM: a {layout} follow-up reused no cached tokens")
    rows.append(["pool / reserved", "", rows[1][2] / rows[0][2], rows[1][3] / rows[0][3], "", "",
                 rows[1][6] / rows[0][6], "", "", ""])
    same_layouts = firsts["reserved"] == firsts["pool"]
    n_c, n_k = len(res["raw"]["pool"]["cached"]), len(res["raw"]["pool"]["cold"])
    title = (f"3. TTFT of a short question appended to a cached conversation vs a cold prefill: real model, real "
             f"prefills, --max-context {ctx} (trained length), --prefill-chunk {p['prefill_chunk']}, {a.threads} "
             f"threads; both layouts in one process, interleaved request by request; medians of {n_c} cached "
             f"follow-ups (a chain, each extending the last) and {n_k} cold prefills (the chain's first and "
             f"last prompt); 'last pair' = the last follow-up vs a cold prefill of exactly its tokens")
    run.tables["ttft"] = print_table(
        title, ["layout", "prompt tokens", "cold TTFT s", "cached TTFT ms", "cached / cold %",
                "last pair %", "cached best ms", "num_cached_tokens", "prefilled", "same first token"], rows)
    if s != 1:
        run.note(f"ttft at scale {s}: the appended question is not scaled (~{rows[0][8]} tokens against a "
                 f"{ctx}-token context), so cached / cold is not comparable with the 5 % target")
    verdict = ("target cached / cold < 5 %: " + ", ".join(
        f"{r[0]} {'met' if r[4] < 5 else 'MISSED'}" for r in rows[:2])
        + f"; greedy first tokens identical across layouts: {'yes' if same_layouts else 'NO'}")
    print(verdict)
    run.tables["ttft"] += "\n" + verdict
    if not same_layouts:
        run.note("greedy first tokens differ between the layouts (DESIGN.md says they must not)")

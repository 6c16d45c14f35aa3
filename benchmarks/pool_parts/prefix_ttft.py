"""Part 5c: time to first token of each new conversation that shares a system prompt, with
and without sharing; real model, real prefills, one pooled engine, arms interleaved by N.

N = 1, 4, 16 conversations arrive one after another, each a 2K-token system prompt
(scaled by --scale) plus its own 64-token question, one token each; earlier ones stay
cached. "sharing": the scheduler's cache as it is (a new conversation forks the cached
prefix: full chunks shared, the partial last chunk copied, only the question is
prefilled). "without": a cache that never finds a prefix, so every conversation prefills
the whole system prompt and holds its own copy.
"""

from __future__ import annotations

import statistics
import sys
from typing import TYPE_CHECKING

from benchmarks.common import peak_rss_mib, print_table
from benchmarks.pool_parts import MODEL_OVERHEAD
from benchmarks.pool_parts.prefix import QUESTION_TOKENS, SHARERS, SYSTEM_TOKENS, _caches
from benchmarks.pool_parts.synthetic import make_engine, random_tokens
from benchmarks.pool_parts.ttft import timed_request

if TYPE_CHECKING:
    from benchmarks.pool import Run


def arm_prefix_ttft(p: dict) -> dict:
    _, NoSharingCache = _caches()
    from strata.engine.cache import ConversationCache

    system_len, n_max = p["system"], max(p["sharers"])
    per_conv = -(-(system_len + QUESTION_TOKENS + 2) // p["chunk"]) * p["chunk"]
    engine = make_engine(p, "pool", 4 * per_conv, n_max, n_max * per_conv + 4 * p["chunk"], 4 * per_conv)
    vocab = engine.model_config.vocab_size
    system = random_tokens(system_len, 1, vocab)
    out = {}
    for n in p["sharers"]:
        for arm, cache_cls in (("sharing", ConversationCache), ("without", NoSharingCache)):
            engine._scheduler.clear_cache()
            engine._scheduler.replace_cache(cache_cls())
            prompts = [system + random_tokens(QUESTION_TOKENS, 100 + i, vocab) for i in range(n)]
            rows = [timed_request(engine, prompt) for prompt in prompts]
            st = engine._scheduler.stats()
            out[f"{n}|{arm}"] = {"requests": rows, "chunks_held": st.num_chunks_held,
                                 "chunks_shared": st.num_chunks_shared, "cells_saved": st.num_cells_saved}
            later = [r["ttft_s"] for r in rows[1:]]
            print(f"  N={n} {arm}: first {rows[0]['ttft_s']:.2f} s, later median "
                  f"{statistics.median(later) if later else float('nan'):.2f} s, chunks held {st.num_chunks_held}",
                  file=sys.stderr)
    engine._scheduler.clear_cache()
    engine._scheduler.replace_cache(ConversationCache())
    return {"results": out, "peak_rss_mib": peak_rss_mib()}


def measure(run: Run) -> None:
    a = run.args
    s = a.scale
    system = max(64, SYSTEM_TOKENS // s)
    chunk = max(16, 256 // s)
    if not run.enough("prefix ttft", MODEL_OVERHEAD + max(SHARERS) * (system + 128) * 23040):
        return
    p = {"threads": a.threads, "chunk": chunk, "scale": s, "system": system, "sharers": list(SHARERS)}
    res = run.child("prefix_ttft", p)
    if res is None:
        return
    run.payload["prefix_ttft"] = {"params": p, **res}
    rows = []
    for n in SHARERS:
        row = [n]
        for arm in ("sharing", "without"):
            r = res["results"][f"{n}|{arm}"]
            later = [x["ttft_s"] for x in r["requests"][1:]]
            row += [r["requests"][0]["ttft_s"], statistics.median(later) if later else "-",
                    statistics.median(x["num_cached_tokens"] for x in r["requests"]), r["chunks_held"]]
        rows.append(row)
    run.tables["prefix_ttft"] = print_table(
        f"5c. TTFT of each new conversation sharing a {system}-token system prompt (+{QUESTION_TOKENS}-token "
        f"question), real model, --kv-chunk {chunk}; conversations arrive one after another and stay cached",
        ["N", "sharing: first s", "later median s", "cached tokens (median)", "chunks held",
         "without: first s", "later median s", "cached tokens (median)", "chunks held"], rows)

"""Part 5: identical prefixes. Scheduler only (no model, no K/V storage): chunk ids, not bytes.

a. admission time, prefix lookup included (`Scheduler.schedule` admitting one request),
   with 10, 100 and 1000 parked conversations of 2K tokens, for the radix-tree index
   ("after") against the linear scan it replaced ("before": a copy of the old algorithm
   kept below, `LinearScanCache`, with no index upkeep at all). Two workloads: parked
   conversations that share a 1K-token system prompt with the new request, and ones that
   share nothing. Arms interleaved request by request in one process.
b. chunks held by N = 1, 4, 16 conversations sharing one 2K-token system prompt (each adds
   a 64-token question and decodes 16 tokens), with sharing (forks of the cached prefix)
   and without (a cache that never finds a prefix: every conversation prefills the system
   prompt itself), at several --kv-chunk sizes: only full chunks are shared, so a 2K prompt
   in 4096-cell chunks shares nothing (it is copied, not recomputed). "arriving together":
   all N admitted in one step, so none can fork another; each computes the prompt and the
   commit makes the later ones adopt the first's full chunks (engine/dedup.py).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from typing import TYPE_CHECKING

from benchmarks.common import print_table

if TYPE_CHECKING:
    from benchmarks.pool import Run

PARKED = (10, 100, 1000)
CONV_TOKENS = 2048
SYSTEM_TOKENS = 2048
QUESTION_TOKENS = 64
DECODE_TOKENS = 16
SHARERS = (1, 4, 16)
CHUNKS = (4096, 1024, 256)


def scan_longest_prefix(convs, token_ids: list[int]):
    """The pre-index algorithm: every conversation compared with the prompt, token by token
    (ties: idle over active, then the most recently used). tests/checks.py holds the same scan
    as the reference the index is tested against."""
    from strata.engine.prefix_index import common_prefix_len

    best, best_len = None, 0
    for conv in convs:
        n = common_prefix_len(conv.token_ids, token_ids)
        if n == 0:
            continue
        key = (n, not conv.is_active, conv.last_used)
        if best is None or key > (best_len, not best.is_active, best.last_used):
            best, best_len = conv, n
    return best, best_len


def _caches():
    """The "before" cache (the pre-index algorithm, verbatim) and a cache that never shares."""
    from strata.engine.cache import ConversationCache

    class _NoIndex:
        def add(self, conv): ...
        def remove(self, conv): ...
        def grew(self, conv): ...
        def cut(self, conv): ...
        def touched(self, conv): ...
        def check(self, convs): ...
        def other_holder(self, conv, num_tokens, active): return None  # noqa: E704 - no index: no adoption

    class LinearScanCache(ConversationCache):
        """BEFORE: strata's ConversationCache.longest_prefix until this change: every held
        conversation compared with the prompt, on the engine thread (no index kept)."""

        def __init__(self):
            super().__init__()
            self._index = _NoIndex()

        def longest_prefix(self, token_ids):
            return scan_longest_prefix(self._conversations.values(), token_ids)  # the old algorithm

    class NoSharingCache(ConversationCache):
        """Never finds a prefix: every conversation prefills (and holds) all of its tokens."""

        def longest_prefix(self, token_ids):
            return None, 0

        def other_holder(self, conv, num_tokens):
            return None  # (no chunk computed twice at once is adopted either)

        def check(self):
            self._index.check(self)  # (not the comparison with a scan: it answers None on purpose)

    return LinearScanCache, NoSharingCache


def _scheduler(cache_cls, num_chunks: int, chunk: int, lanes: int):
    from strata.engine.scheduler import Scheduler
    from strata.kv.layout import PooledLayout

    s = Scheduler(PooledLayout(num_chunks, chunk), lanes, max_context=8 * CONV_TOKENS, prefill_chunk=1 << 20)
    if cache_cls is not None:
        s.replace_cache(cache_cls())
    return s


def admission(p: dict) -> dict:
    LinearScanCache, _ = _caches()
    rng = random.Random(0)
    words = lambda n: [rng.randrange(3, 49000) for _ in range(n)]  # noqa: E731
    system = words(CONV_TOKENS // 2)
    out = {}
    for workload in ("shared system prompt", "distinct"):
        for num_parked in p["parked"]:
            head = system if workload == "shared system prompt" else []
            convs = [head + words(CONV_TOKENS - len(head)) for _ in range(num_parked)]
            prompts = [head + words(200) for _ in range(p["reps"])]
            arms = {"before": _scheduler(LinearScanCache, num_parked + 8, 4096, 1),
                    "after": _scheduler(None, num_parked + 8, 4096, 1)}
            for s in arms.values():
                for tokens in convs:
                    s.restore(tokens, [0])  # parked without a lane
            times = {a: {"admit_us": [], "lookup_us": []} for a in arms}
            cached: dict[int, set[int]] = {}
            for i, prompt in enumerate(prompts):
                for arm, s in arms.items():
                    t = time.perf_counter()
                    s.cache.longest_prefix(prompt)
                    times[arm]["lookup_us"].append((time.perf_counter() - t) * 1e6)
                    s.add(f"r{i}", prompt)
                    t = time.perf_counter()
                    plan = s.schedule()
                    times[arm]["admit_us"].append((time.perf_counter() - t) * 1e6)
                    assert plan.admitted and plan.admitted[0].num_cached >= len(head), plan
                    cached.setdefault(i, set()).add(plan.admitted[0].num_cached)
                    s.abort(f"r{i}")
            assert all(len(v) == 1 for v in cached.values()), "before and after reused different prefixes"
            for arm in arms:
                out[f"{workload}|{num_parked}|{arm}"] = {k: statistics.median(v) for k, v in times[arm].items()}
                out[f"{workload}|{num_parked}|{arm}"]["raw_admit_us"] = times[arm]["admit_us"]
            b, a = (out[f"{workload}|{num_parked}|{arm}"]["admit_us"] for arm in ("before", "after"))
            print(f"  {workload}, {num_parked} parked: admission before {b:.0f} us, after {a:.0f} us", file=sys.stderr)
    return out


def _sample(plan):
    from strata.step import Sampled, StepOutput

    return StepOutput(tuple(Sampled(w.request_id, 7, None) for w in plan.work if w.do_sample))


def sharing(p: dict) -> dict:
    _, NoSharingCache = _caches()
    rng = random.Random(1)
    system = [rng.randrange(3, 49000) for _ in range(SYSTEM_TOKENS)]
    out = {}
    for chunk in p["chunks"]:
        for n in p["sharers"]:
            for arm, cache_cls in (("sharing", None), ("together", None), ("no sharing", NoSharingCache)):
                s = _scheduler(cache_cls, 64 * n + 64, chunk, n)
                computed = 0
                # one after another, each still running when the next arrives; "together": all in one step
                for batch in ([list(range(n))] if arm == "together" else [[i] for i in range(n)]):
                    for i in batch:
                        s.add(f"r{i}", system + [rng.randrange(3, 49000) for _ in range(QUESTION_TOKENS)])
                    while any(s.seqs.get(f"r{i}") is None or s.seqs[f"r{i}"].is_prefilling for i in batch):
                        plan = s.schedule()
                        computed += sum(len(w.token_ids) for w in plan.work if len(w.token_ids) > 1)
                        s.commit(plan, _sample(plan))
                for _ in range(DECODE_TOKENS):
                    plan = s.schedule()
                    s.commit(plan, _sample(plan))
                s.check()
                st = s.stats()
                out[f"{chunk}|{n}|{arm}"] = {
                    "chunks_held": st.num_chunks_held, "cells_held": st.num_chunks_held * chunk,
                    "chunks_shared": st.num_chunks_shared, "cells_saved": st.num_cells_saved,
                    "prompt_tokens_computed": computed, "cells_copied": s.counters.num_cells_copied,
                    "chunks_adopted": s.counters.num_chunks_adopted,
                }
    return out


def arm_prefix(p: dict) -> dict:
    return {"admission": admission(p), "sharing": sharing(p)}


def measure(run: Run) -> None:
    q = run.args.quick
    p = {"parked": list(PARKED), "reps": 9 if q else 31, "sharers": list(SHARERS), "chunks": list(CHUNKS)}
    res = run.child("prefix", p)
    if res is None:
        return
    run.payload["prefix"] = {"params": p, **res}
    adm = res["admission"]
    rows = []
    for workload in ("shared system prompt", "distinct"):
        for n in PARKED:
            b, a = adm[f"{workload}|{n}|before"], adm[f"{workload}|{n}|after"]
            rows.append([workload, n, b["lookup_us"], a["lookup_us"], b["admit_us"], a["admit_us"],
                         b["admit_us"] / a["admit_us"]])
    run.tables["prefix_admission"] = print_table(
        f"5a. admission of one request (Scheduler.schedule, prefix lookup included) with N parked conversations "
        f"of {CONV_TOKENS} tokens; median of {p['reps']}, arms interleaved; before = the linear scan this change "
        f"replaced, after = the radix-tree index",
        ["parked conversations share", "N parked", "lookup before us", "lookup after us", "admission before us",
         "admission after us", "before / after"], rows)
    sh = res["sharing"]
    rows = []
    for chunk in CHUNKS:
        for n in SHARERS:
            w, t, wo = (sh[f"{chunk}|{n}|{arm}"] for arm in ("sharing", "together", "no sharing"))
            rows.append([chunk, n, w["chunks_held"], t["chunks_held"], wo["chunks_held"], w["chunks_shared"],
                         w["cells_saved"], w["prompt_tokens_computed"], wo["prompt_tokens_computed"],
                         w["cells_copied"]])
    run.tables["prefix_sharing"] = print_table(
        f"5b. N conversations sharing one {SYSTEM_TOKENS}-token system prompt ({QUESTION_TOKENS}-token question "
        f"each, {DECODE_TOKENS} tokens decoded, all still running): pool chunks held with and without sharing",
        ["--kv-chunk", "N", "chunks held", "arriving together", "without sharing", "shared chunks", "cells saved",
         "prompt tokens computed", "without sharing", "cells copied"], rows)
    _plot(run, adm)


def _plot(run: Run, adm: dict) -> None:
    import os

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        run.note("matplotlib is not installed: the prefix plot is skipped (numbers in pool.json under prefix)")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for workload, style in (("shared system prompt", "-"), ("distinct", "--")):
        for arm, marker in (("before", "o"), ("after", "s")):
            ax.loglog(PARKED, [adm[f"{workload}|{n}|{arm}"]["admit_us"] for n in PARKED], marker + style,
                      label=f"{arm} ({'linear scan' if arm == 'before' else 'radix tree'}), {workload}")
    ax.set_xlabel("parked conversations (2K tokens each)")
    ax.set_ylabel("admission time, us (median)")
    ax.set_title("prefix lookup at admission: linear scan vs radix tree")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    path = os.path.join(run.args.out, "pool-prefix-quick.png" if run.args.quick else "pool-prefix.png")
    os.makedirs(run.args.out, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    run.payload.setdefault("prefix", {})["plot"] = path
    print(f"plot: {path}")

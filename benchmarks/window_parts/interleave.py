"""One turn in two engines at once, single steps interleaved (benchmarks/window.py's decode arm)."""

from __future__ import annotations

import statistics
import time


def interleaved_turn(engines: dict, prompt: list[int], params, first: str) -> tuple[dict, list[float]]:
    """The same turn in every arm at once: one step of each engine in turn (the order alternating
    from pair to pair, `first` leading), each step timed alone. Returns per arm its follow-up TTFT
    (its submit and its own steps to the first token: the other arm's steps are not counted), its
    decode tok/s (1 / the median of its decode steps) and tokens; and, for each pair of decode steps
    (one of each arm, back to back), keep's step time / groups' (> 1: groups decodes faster)."""
    order = (first, *(a for a in engines if a != first))
    rows, rids, steps = {}, {}, {arm: [] for arm in engines}
    for arm in order:
        t0 = time.perf_counter()
        rids[arm] = engines[arm].submit(prompt, params)
        rows[arm] = {"follow_ttft_s": time.perf_counter() - t0, "tokens": []}
    ratios, started, i = [], set(), 0
    while any(e.has_work for e in engines.values()):
        pair = {}
        for arm in (order if i % 2 == 0 else order[::-1]):
            e = engines[arm]
            if not e.has_work:
                continue
            ts = time.perf_counter()
            got = [t for o in e.step() if o.request_id == rids[arm] for t in o.new_token_ids]
            dt = time.perf_counter() - ts
            if arm not in started:
                rows[arm]["follow_ttft_s"] += dt
                started.update([arm] if got else [])
            elif got:
                steps[arm].append(dt)
                pair[arm] = dt
            rows[arm]["tokens"] += got
        if len(pair) == 2:
            ratios.append(pair["keep"] / pair["groups"])
        i += 1
    for arm in engines:
        rows[arm]["decode_tok_s"] = 1 / statistics.median(steps[arm])
    return rows, ratios

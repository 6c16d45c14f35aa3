"""The bytes' cost: what a ring arm's streamed bytes cost when copied alone, timed in the same
run, against what the ring costs a step over no ring.

The copy alone moves a step's streamed bytes (the arm's median bytes a token: one token a
step at one lane) in one copy per layer and K or V, as the ring's merged runs do at the
deep tier, from a source larger than the last-level cache (each copy reads bytes no copy
read in the last round) into a destination the size of one copy (staging is reused per
layer), with the run's torch threads; and the same bytes read again each round (from cache
where they fit it), the cheapest they can cost. The ring's extra cost is its median step minus no
ring's, per round (the arms ran interleaved), median over rounds. "cost / bytes" at most 1:
the arm costs no more than its bytes.
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.common import print_table

MIB = 1 << 20
SOURCE_BYTES = 2 << 30  # past any last-level cache this runs on (the AMX guests report 480 MiB)


def copy_alone_ms(src: torch.Tensor, step_bytes: float, copies: int, budget_s: float = 0.1) -> float:
    """Median ms of `copies` copies of step_bytes / copies each out of `src` (bf16, 1-d) at a
    rotating offset: from memory where `src` is larger than the last-level cache, from cache
    where it holds just one step's bytes (each round reads them again). Rounds: as many as fit
    `budget_s` (9 to 200), after one untimed."""
    n = max(1, int(step_bytes) // copies // 2)  # bf16 values a copy
    assert n * copies <= src.numel(), "the source holds a step's bytes"
    dst = torch.empty(n, dtype=torch.bfloat16)
    off = 0

    def one_round() -> float:
        nonlocal off
        t = time.perf_counter()
        for _ in range(copies):
            if off + n > src.numel():
                off = 0
            dst.copy_(src[off:off + n])
            off += n
        return time.perf_counter() - t

    rounds = min(200, max(9, int(budget_s / max(one_round(), 1e-6))))
    return statistics.median(one_round() for _ in range(rounds)) * 1e3


def ring_extra_ms(raw: dict[str, list[dict]], arm: str, reference: str = "no-ring") -> float:
    """Median over rounds of (arm's median step - reference's median step), ms."""
    return statistics.median((statistics.median(a["step_s"]) - statistics.median(b["step_s"])) * 1e3
                             for a, b in zip(raw[arm], raw[reference]))


def bytes_cost(tiers_raw: dict[str, dict], tiers: dict[str, dict], layers: int, threads: int,
               arms: tuple[str, ...] = ("default", "cap", "adaptive")) -> dict:
    """tier -> arm -> {MiB a token, copy alone ms, ring extra ms, cost / bytes}."""
    most = max(tiers[t]["arms"][arm]["bytes_per_token"] for t in tiers_raw for arm in arms)
    torch.set_num_threads(threads)
    src = torch.ones(max(SOURCE_BYTES, 4 * int(most)) // 2, dtype=torch.bfloat16) if most > 0 else None
    out: dict[str, dict] = {}
    for tier, raw in tiers_raw.items():
        out[tier] = {}
        for arm in arms:
            b = tiers[tier]["arms"][arm]["bytes_per_token"]
            alone = copy_alone_ms(src, b, 2 * layers) if b > 0 else 0.0
            cached = copy_alone_ms(src[:max(1, int(b) // 2)], b, 2 * layers) if b > 0 else 0.0
            extra = ring_extra_ms(raw, arm)
            out[tier][arm] = {"mib_per_token": b / MIB, "copy_alone_ms": alone, "copy_cached_ms": cached,
                              "ring_extra_ms": extra, "extra_over_bytes": extra / alone if alone > 0 else None}
    return out


def bytes_table(cost: dict, header: str) -> str:
    rows = [[tier, arm, c["mib_per_token"], c["copy_alone_ms"], c["copy_cached_ms"], c["ring_extra_ms"],
             "-" if c["extra_over_bytes"] is None else c["extra_over_bytes"]]
            for tier, arms in cost.items() for arm, c in arms.items()]
    return print_table(f"the ring's cost a step against its streamed bytes copied alone (from memory; from "
                       f"cache: the same bytes each round). {header}",
                       ["tier", "arm", "MiB streamed/tok", "copy alone ms", "from cache ms", "ring - no ring ms",
                        "cost / bytes"], rows)

"""DRAFT_COST (drafting/adaptive.py): the extra cost of one more verified row, in plain
decode steps, measured on the spec arm's own engine.

One request per lane (its prompt prefilled beforehand, untimed) decodes greedily while the
step's draft count k cycles over 0..max_k step by step (order rotating per cycle, so drift
hits every k alike): a fixed-k
planner replaces the engine's adaptive one for the measurement and is put back after. Drafts
are random token ids, so the model rejects them (a clash has odds ~k/vocab): every step
costs a verify forward of 1 + k rows per lane and emits one token, and the context grows
by one cell per step whatever k is. k = 0 is a plain one-row decode step (same runner path
as --spec off). Ratio(k) = median step(k) / median step(0); DRAFT_COST = the least-squares
slope of ratio against k, through ratio(0) = 1.
"""

from __future__ import annotations

import random
import statistics
import time


def _fixed_planner(engine, max_k: int, seed: int):
    from strata.drafting.adaptive import AdaptiveK
    from strata.drafting.planner import LaneSpec, NgramPlanner

    vocab = engine.model_config.vocab_size
    rng = random.Random(seed)

    class FixedK(AdaptiveK):
        now = 0  # the k of the step being planned, set by the measurement loop

        def k(self) -> int:
            return FixedK.now

    class RandomDrafter:
        def propose(self, seq, k: int) -> list[int]:
            return [rng.randrange(vocab) for _ in range(k)]

    class FixedPlanner(NgramPlanner):
        def state(self, seq):
            if seq.spec is None or not isinstance(seq.spec.k, FixedK):
                seq.spec = LaneSpec(FixedK(self.max_k))
            return seq.spec

    old = engine._scheduler.drafts
    return FixedK, FixedPlanner(max_k, old.layout, old.max_context, old.max_step_rows, RandomDrafter()), old


def measure(arm, prompts: list[list[int]], max_k: int, cycles: int, seed: int = 5) -> dict | None:
    """`arm`: the spec arm (arm.py); `prompts`: one per lane; `cycles` steps at each k in
    0..max_k. Returns the step medians by k, the ratios, the slope and the raw step times; None
    where no step could take drafts (the lanes fill a step's row limit: planner.py)."""
    from strata.sampling import SamplingParams

    engine = arm.engine
    arm.warm(prompts)  # the prompts cached in their lanes: every lane starts decoding at once
    fixed_k, planner, old = _fixed_planner(engine, max_k, seed)
    ks = list(range(max_k + 1))
    steps: dict[int, list[float]] = {k: [] for k in ks}
    engine._scheduler.drafts = planner
    try:
        params = SamplingParams(temperature=0, max_tokens=cycles * len(ks) + 16, ignore_eos=True)  # aborted after
        rids = [engine.submit(p, params) for p in prompts]
        seen: set[str] = set()
        while len(seen) < len(rids):  # prefill, until every lane has its first token
            seen.update(o.request_id for o in engine.step() if o.new_token_ids)
        for c in range(cycles):
            order = ks[c % len(ks):] + ks[: c % len(ks)]
            for k in order:
                fixed_k.now = k
                before = planner.counters.num_drafted
                t = time.perf_counter()
                outs = engine.step()
                dt = time.perf_counter() - t
                drafted = planner.counters.num_drafted - before
                if drafted == k * len(rids) and sum(len(o.new_token_ids) for o in outs) == len(rids):
                    steps[k].append(dt)  # every lane verified k drafts and all were rejected
        for r in rids:
            engine.cancel(r)
    finally:
        engine._scheduler.drafts = old
    med = {k: statistics.median(v) for k, v in steps.items() if v}
    ratio = {k: med[k] / med[0] for k in med}
    xs = [k for k in ratio if k > 0]
    if not xs:  # no step took drafts: the lanes alone fill the rows a step may have (planner.py)
        return None
    slope = sum(k * (ratio[k] - 1) for k in xs) / sum(k * k for k in xs)
    return {"lanes": len(prompts), "cycles": cycles, "step_ms": {k: v * 1e3 for k, v in med.items()},
            "ratio": ratio, "draft_cost": slope, "samples": {k: len(v) for k, v in steps.items()},
            "step_s": steps}

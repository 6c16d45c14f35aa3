"""Rounds -> medians per arm, the paired spec/off ratio, acceptance, and the issue's targets.

Per round an arm's decode speed is its pure-decode tokens / their wall time (arm.py); across
rounds, medians. The ratio ngram/off is the median over rounds of the per-round ratio (both
arms ran interleaved in that round), so drift between rounds cancels. Acceptance = drafts
kept / drafts proposed, over all rounds.
"""

from __future__ import annotations

import statistics

SPEC, OFF = "ngram", "off"
# the targets: (workload, lanes) -> the least ngram/off decode tok/s ratio
TARGETS = {("repeat", 1): 1.5, ("chat", 1): 0.97, ("chat", 8): 0.97}


def arm_summary(rounds: list[dict]) -> dict:
    drafted = sum(r["drafted"] for r in rounds)
    accepted = sum(r["accepted"] for r in rounds)
    verify = sum(r["verify_steps"] for r in rounds)
    return {
        "tok_s": statistics.median(r["tok_s"] for r in rounds),
        "decode_tokens": sum(r["decode_tokens"] for r in rounds),
        "decode_steps": sum(r["decode_steps"] for r in rounds),
        "tokens_per_step": sum(r["decode_tokens"] for r in rounds) / max(1, sum(r["decode_steps"] for r in rounds)),
        "drafted": drafted, "accepted": accepted, "verify_steps": verify,
        "acceptance": accepted / drafted if drafted else None,
        "drafts_per_verify": drafted / verify if verify else None,
    }


def cell_summary(workload: str, lanes: int, raw: dict[str, list[dict]]) -> dict:
    spec, off = raw[SPEC], raw[OFF]
    ratios = [s["tok_s"] / o["tok_s"] for s, o in zip(spec, off)]
    pairs = [(a, b) for s, o in zip(spec, off) for a, b in zip(s["out"], o["out"])]
    target = TARGETS.get((workload, lanes))
    ratio = statistics.median(ratios)
    return {
        "workload": workload, "lanes": lanes, "rounds": len(ratios),
        "arms": {SPEC: arm_summary(spec), OFF: arm_summary(off)},
        "ratio": ratio, "round_ratios": ratios, "same_requests": sum(a == b for a, b in pairs), "requests": len(pairs),
        "same_tokens": all(a == b for a, b in pairs),
        "target": target, "meets_target": None if target is None else ratio >= target,
    }


def verdict(cells: list[dict]) -> dict:
    judged = [c for c in cells if c["target"] is not None]
    rounds = min((c["rounds"] for c in cells), default=0)
    return {
        "targets": "ngram/off decode tok/s: >= 1.5 on repeat at 1 lane; >= 0.97 (at most 3 % loss) on chat at "
                   "1 and 8 lanes",
        "checks": [{"workload": c["workload"], "lanes": c["lanes"], "ratio": c["ratio"], "target": c["target"],
                    "ok": c["meets_target"]} for c in judged],
        "all_met": all(c["meets_target"] for c in judged) if judged else None,
        "note": None if rounds >= 3 else f"{rounds} round(s): too few for a verdict",
    }

"""Rounds -> medians per arm, paired ratios between arms, and the seed's pre-registered rule.

Per round an arm's decode speed is 1 / (its median decode step); across rounds, medians.
A ratio a/b is the median over rounds of the per-round ratio (a and b ran interleaved in
that round), so drift between rounds cancels.

The rule (seed thread, pre-registered before its measurement): with the fixed default ring
as the control, the adaptive arm must not lose at the shallow tiers (shallow, middle) and
must gain at the deep one. "Lose" / "gain" are decided against a noise band (`--noise`,
a fraction); bytes streamed per token are counted, not timed, and are judged exactly.
"""

from __future__ import annotations

import statistics

SHALLOW_TIERS = ("shallow", "middle")
DEEP_TIER = "deep"
CONTROL = "default"


def tok_s(rec: dict) -> float:
    return 1.0 / statistics.median(rec["step_s"])


def arm_summary(rounds: list[dict], reference: list[dict] | None) -> dict:
    """Medians over rounds of one arm; `reference` (the no-ring arm) decides `same_tokens`."""
    hits = [r["hit_ratio"] for r in rounds if r["hit_ratio"] is not None]
    return {
        "tok_s": statistics.median(tok_s(r) for r in rounds),
        "step_ms": statistics.median(statistics.median(r["step_s"]) for r in rounds) * 1e3,
        "bytes_per_token": statistics.median(r["bytes_per_token"] for r in rounds),
        "pages_per_token": statistics.median(r["pages_per_token"] for r in rounds),
        "turn_bytes": statistics.median(r["turn_bytes"] for r in rounds),
        "hit_ratio": statistics.median(hits) if hits else None,
        "ring_cells": rounds[-1]["ring_cells"],
        "expected_ring": rounds[-1]["expected_ring"],
        "ring_as_rule": all(r["ring_cells"] == r["expected_ring"] for r in rounds),
        "log": sorted({line for r in rounds for line in r["log"] if line.startswith("KV ring adaptive")}),
        "context_cells": [r["context_cells"] for r in rounds],
        "decode_steps": sum(r["decode_steps"] for r in rounds),
        "same_tokens": None if reference is None else all(a["out"] == b["out"] for a, b in zip(rounds, reference)),
    }


def paired_ratio(a: list[dict], b: list[dict]) -> float:
    return statistics.median(tok_s(x) / tok_s(y) for x, y in zip(a, b))


def summarise(raw: dict[str, list[dict]], reference: str | None, pairs: list[tuple[str, str]]) -> dict:
    ref = raw.get(reference) if reference else None
    arms = {n: arm_summary(rs, ref if n != reference else None) for n, rs in raw.items()}
    ratios = {f"{a}/{b}": paired_ratio(raw[a], raw[b]) for a, b in pairs if a in raw and b in raw}
    return {"arms": arms, "ratios": ratios}


def judge_rule(tiers: dict[str, dict], noise: float, rounds: int) -> dict:
    """tiers: name -> summarise() output with an `adaptive/default` ratio."""
    checks = []
    for tier, s in tiers.items():
        ratio = s["ratios"]["adaptive/default"]
        b_ad, b_def = s["arms"]["adaptive"]["bytes_per_token"], s["arms"][CONTROL]["bytes_per_token"]
        if tier == DEEP_TIER:
            speed_ok, bytes_ok, want = ratio > 1 + noise, b_ad < b_def, "gain"
        else:
            speed_ok, bytes_ok, want = ratio >= 1 - noise, b_ad <= b_def, "not lose"
        checks.append({"tier": tier, "want": want, "ratio": ratio, "speed_ok": speed_ok, "bytes_adaptive": b_ad,
                       "bytes_default": b_def, "bytes_ok": bytes_ok})
    speed = all(c["speed_ok"] for c in checks)
    return {
        "rule": "adaptive vs fixed default ring: must not lose at the shallow tiers (shallow, middle) and must "
                f"gain at the deep one; lose/gain = paired tok/s ratio beyond a {noise:.0%} noise band",
        "checks": checks,
        "holds_speed": speed,
        "holds_bytes": all(c["bytes_ok"] for c in checks),
        "rounds": rounds,
        "note": None if rounds >= 3 else f"{rounds} round(s): too few for a verdict on speed",
    }

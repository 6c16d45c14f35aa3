"""The printed tables: arms per tier, ratios per tier, the rule's verdict, the page sweep and
the eviction policies. Each returns its text (also kept in ring.json)."""

from __future__ import annotations

from benchmarks.common import print_table

MIB = 1 << 20
ARM_COLUMNS = ["arm", "ring cells", "as rule", "context", "decode tok/s", "step ms", "MiB streamed/tok",
               "pages/tok", "hit ratio", "same tokens"]


def _ring(a: dict) -> str:
    return "-" if a["ring_cells"] is None else str(a["ring_cells"])


def _row(name: str, a: dict) -> list:
    ctx = a["context_cells"]
    return [name, _ring(a), "-" if a["expected_ring"] is None else ("yes" if a["ring_as_rule"] else "NO"),
            f"{ctx[0]}-{ctx[-1]}" if ctx[0] != ctx[-1] else str(ctx[0]), a["tok_s"], a["step_ms"],
            a["bytes_per_token"] / MIB, a["pages_per_token"], "-" if a["hit_ratio"] is None else a["hit_ratio"],
            "ref" if a["same_tokens"] is None else ("yes" if a["same_tokens"] else "no")]


def tier_table(tier: str, cells: int, s: dict, header: str) -> str:
    rows = [_row(n, a) for n, a in s["arms"].items()]
    return print_table(f"{tier} tier: {cells} SYNTHETIC cells + a real turn per round. {header}", ARM_COLUMNS, rows)


def ratio_table(tiers: dict[str, dict], pairs: list[str], header: str) -> str:
    rows = [[tier, *(s["ratios"].get(p, float("nan")) for p in pairs)] for tier, s in tiers.items()]
    return print_table(f"decode tok/s ratios (median of per-round paired ratios). {header}", ["tier", *pairs], rows)


def rule_text(verdict: dict) -> str:
    lines = [f"pre-registered rule (seed thread): {verdict['rule']}"]
    for c in verdict["checks"]:
        lines.append(f"  {c['tier']:8s} want {c['want']:8s} adaptive/default {c['ratio']:.3f} -> "
                     f"{'ok' if c['speed_ok'] else 'FAILS'}; MiB streamed/tok {c['bytes_adaptive'] / MIB:.1f} vs "
                     f"{c['bytes_default'] / MIB:.1f} -> {'ok' if c['bytes_ok'] else 'FAILS'}")
    lines.append(f"  holds on decode speed: {'yes' if verdict['holds_speed'] else 'NO'}; "
                 f"holds on bytes streamed: {'yes' if verdict['holds_bytes'] else 'NO'}")
    if verdict["note"]:
        lines.append(f"  note: {verdict['note']}")
    text = "\n".join(lines)
    print(text)
    return text


def sweep_table(title: str, s: dict, key_label: str) -> str:
    cols = [key_label, "ring cells", "decode tok/s", "step ms", "MiB streamed/tok", "MiB/turn", "pages/tok",
            "hit ratio",
            "same tokens", "tok/s ratio"]
    first = next(iter(s["arms"]))
    rows = []
    for n, a in s["arms"].items():
        rows.append([n, _ring(a), a["tok_s"], a["step_ms"], a["bytes_per_token"] / MIB, a["turn_bytes"] / MIB,
                     a["pages_per_token"],
                     "-" if a["hit_ratio"] is None else a["hit_ratio"],
                     "ref" if a["same_tokens"] is None else ("yes" if a["same_tokens"] else "no"),
                     1.0 if n == first else s["ratios"].get(f"{n}/{first}", float("nan"))])
    return print_table(f"{title} (tok/s ratio: paired, against {first})", cols, rows)

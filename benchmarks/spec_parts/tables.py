"""The printed tables: arms side by side per workload and lane count, the targets' verdict,
and the DRAFT_COST measurement. Each returns its text (also kept in spec.json)."""

from __future__ import annotations

from benchmarks.common import print_table

COLUMNS = ["workload", "lanes", "off tok/s", "ngram tok/s", "ngram/off", "target", "acceptance",
           "drafts/verify", "tok/step ngram", "same tokens (requests)"]


def _opt(v, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def speed_table(cells: list[dict], header: str) -> str:
    rows = []
    for c in cells:
        s, o = c["arms"]["ngram"], c["arms"]["off"]
        ok = "" if c["meets_target"] is None else (" ok" if c["meets_target"] else " MISSED")
        rows.append([c["workload"], c["lanes"], o["tok_s"], s["tok_s"], f"{c['ratio']:.3f}",
                     _opt(c["target"], ">= {:.2f}") + ok, _opt(s["acceptance"]), _opt(s["drafts_per_verify"]),
                     s["tokens_per_step"], f"{c['same_requests']}/{c['requests']}"])
    return print_table(f"decode tok/s, --spec ngram vs off (ratio: median of per-round paired ratios). {header}",
                       COLUMNS, rows)


def verdict_text(v: dict) -> str:
    lines = [f"targets (issue 14): {v['targets']}"]
    for c in v["checks"]:
        lines.append(f"  {c['workload']:6s} {c['lanes']} lane(s): ngram/off {c['ratio']:.3f} (want >= "
                     f"{c['target']:.2f}) -> {'ok' if c['ok'] else 'MISSED'}")
    lines.append(f"  all met: {'-' if v['all_met'] is None else ('yes' if v['all_met'] else 'NO')}")
    if v["note"]:
        lines.append(f"  note: {v['note']}")
    text = "\n".join(lines)
    print(text)
    return text


def cost_table(costs: list[dict], current: tuple[float, float]) -> str:
    ks = sorted({int(k) for c in costs for k in c["ratio"]})
    rows = [[f"{c['lanes']} lane(s)", *(c["ratio"].get(k, float("nan")) for k in ks), c["step_ms"][0],
             f"{c['draft_cost']:.3f}"] for c in costs]
    return print_table(f"verify step with k drafts per lane / plain decode step (medians; {costs[0]['cycles']} "
                       f"steps per k, k cycled step by step). adaptive.py models k drafts as 1 + {current[0]} + "
                       f"{current[1]} x (k - 1)",
                       ["lanes", *(f"k={k}" for k in ks), "k=0 ms", "slope"], rows)

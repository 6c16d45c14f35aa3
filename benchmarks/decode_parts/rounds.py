"""decode.py's second table: each arm's decode speed round by round, and each strata arm over
each peer within a round."""

from __future__ import annotations

import statistics


def round_rows(raw: dict[str, list[dict]], strata_arms: list[str], peer_arms: list[str],
               names: dict[str, str]) -> list[list[str]]:
    """Decode tok/s round by round, and each strata arm over each peer per round (a round's arms
    run one after another, close in time: drift between rounds leaves its ratio alone)."""
    def cell(values: list[float], fmt: str = ".4g") -> str:
        return ", ".join(format(v, fmt) for v in values)

    decode = ("decode_tok_s", "decode8_tok_s")
    rows = [[names[a]] + [cell([r[m] for r in raw[a]]) for m in decode] for a in strata_arms + peer_arms]
    for arm in strata_arms:
        for peer in peer_arms:
            ratios = [[x[m] / y[m] for x, y in zip(raw[arm], raw[peer])] for m in decode]
            rows.append([f"{names[arm]} / {peer}"] + [f"{cell(r, '.2f')} (median {statistics.median(r):.2f})"
                                                      for r in ratios])
    return rows

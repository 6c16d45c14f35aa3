"""The arms held in one process, stepped alternately: every round each arm gets the same
prompts, and the engines take one step each in turn until all are done, so drift on a
shared machine hits both alike. The arms' order rotates per round."""

from __future__ import annotations

import sys
import time

from benchmarks.spec_parts.arm import SpecArm


def run_rounds(label: str, arms: dict[str, SpecArm], prompts: list[list[int]], lanes: int, new: int,
               rounds: int) -> dict[str, list[dict]]:
    """`prompts`: the workload's (8); a round feeds `lanes` of them, starting at prompt
    (round * lanes) mod len(prompts). Returns arm name -> one record per round."""
    names = list(arms)
    raw: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(rounds):
        t = time.perf_counter()
        first = (r * lanes) % len(prompts)
        batch = [prompts[(first + i) % len(prompts)] for i in range(lanes)]
        k = r % len(names)
        order = names[k:] + names[:k]
        for n in order:
            arms[n].warm(batch)  # untimed: the round's prompts cached in their lanes
        for n in order:
            arms[n].submit(batch, new)
        while any(arms[n].busy for n in order):
            for n in order:
                if arms[n].busy:
                    arms[n].step()
        for n in order:
            rec = arms[n].end_round()
            rec["round"], rec["prompts"] = r, [(first + i) % len(prompts) for i in range(lanes)]
            raw[n].append(rec)
        speeds = ", ".join(f"{n} {raw[n][-1]['tok_s']:.1f} tok/s" for n in names)
        print(f"  {label} round {r + 1}/{rounds} ({time.perf_counter() - t:.0f} s): {speeds}", file=sys.stderr)
    return raw

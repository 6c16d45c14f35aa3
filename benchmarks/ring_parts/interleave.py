"""Several arms' engines in one process, stepped alternately: in every round each arm gets the
same turn on the same conversation, and the engines take one step each in turn until all are
done, so drift on a shared machine hits every arm alike. The arms' order rotates per round.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Sequence

from benchmarks.ring_parts.held import HeldArm


def engine_config(shared: dict, arm_fields: dict):
    from strata.config import EngineConfig

    return EngineConfig(**shared, **arm_fields)


def run_interleaved(label: str, arms: dict[str, dict], shared: dict, cells: int, new: int, rounds: int,
                    conversations: int = 1, seed: int = 3) -> dict[str, list[dict]]:
    """`arms`: name -> EngineConfig fields; `shared`: the fields every arm has. Each round decodes
    conversation (round % conversations) in every arm; returns name -> one record per round."""
    held = {name: HeldArm(name, engine_config(shared, f), cells, conversations, seed) for name, f in arms.items()}
    names = list(held)
    raw: dict[str, list[dict]] = {n: [] for n in names}
    try:
        for r in range(rounds):
            t = time.perf_counter()
            k = r % len(names)
            order: Sequence[str] = names[k:] + names[:k]
            for n in order:
                held[n].submit(r % conversations, new)
            while any(held[n].busy for n in order):
                for n in order:
                    if held[n].busy:
                        held[n].step()
            for n in order:
                rec = held[n].end_round()
                rec["round"] = r
                raw[n].append(rec)
            steps = ", ".join(f"{n} {_ms(raw[n][-1]['step_s']):.0f} ms" for n in names)
            print(f"  {label} round {r + 1}/{rounds} ({time.perf_counter() - t:.0f} s): median step {steps}",
                  file=sys.stderr)
    finally:
        for h in held.values():
            h.close()
        held.clear()
        gc.collect()
    return raw


def _ms(steps: list[float]) -> float:
    s = sorted(steps)
    return s[len(s) // 2] * 1e3 if s else float("nan")

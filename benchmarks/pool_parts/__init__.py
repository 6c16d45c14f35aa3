"""The parts of benchmarks/pool.py, one measurement per module, and the sizes they share.

`synthetic` holds what the child arms share (engines, synthetic K/V); `move`, `memory`, `runs`,
`ttft`, `decode` and `prefix` each hold one measurement: its arm (run in a child interpreter via
`pool.py --arm ...`) and the parent's side (sizing, rounds, tables). Nothing here imports
torch or strata at import time, so `pool.py --help` stays fast.
"""

from __future__ import annotations

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
BYTES_PER_CELL = 30 * 2 * 3 * 64 * 2  # SmolLM2-135M, bf16: 22.5 KiB; the children report the real value
MODEL_OVERHEAD = int(1.6 * GIB)  # interpreter + torch + model weights + rotary tables (measured ~1.3 GiB)
HEADROOM = 2 * GIB  # left free for the rest of the machine
MOVE_CONTEXT = 262144
CHUNK = 4096
LAYOUTS = ("reserved", "pool")

TURN = "\nUser: Summarise the log in one sentence.\nAssistant:"


def cells_label(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)

"""Run by test_session_rss.py in its own process: restore a synthetic session of >= 2 GiB of K/V
and print, as JSON, the RSS before the restore and its peak during it (VmHWM reset first).

argv: model_dir, work_dir. The K/V is a pattern (each chunk's cells hold its index plus the
layer's), written straight into the pool, saved, dropped, zeroed, and restored; the
pattern is then checked in the restored chunks.
"""

from __future__ import annotations

import gc
import json
import sys

import torch

from strata.config import EngineConfig
from strata.engine.engine import Engine
from strata.cells.session import layer_parts

CHUNK = 2048
NUM_CELLS = 131100  # just over 2 GiB at 16 KiB per cell; not a whole number of chunks


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def fill(engine: Engine, chunk_ids: list[int], scale: float) -> None:
    for layer, parts in enumerate(layer_parts(engine._kv)):
        for t in parts:
            for i in chunk_ids:
                t[:, i * CHUNK : (i + 1) * CHUNK].fill_(scale * (i + 1000 * layer))


def main(model_dir: str, work_dir: str) -> None:
    cfg = EngineConfig(model=model_dir, dtype="float32", max_context=NUM_CELLS + 72, kv_chunk=CHUNK, batch=0,
                       kv_pool_tokens=-(-NUM_CELLS // CHUNK) * CHUNK)
    engine = Engine(cfg, progress=False)
    tokens = [(7 * i) % 40000 for i in range(NUM_CELLS)]
    conv = engine.restore(tokens, [0])
    fill(engine, conv.table.chunk_ids, 1.0)
    path = f"{work_dir}/big.strata"
    saved = engine.save_session(path, token_ids=tokens)
    engine._scheduler.clear_cache()
    fill(engine, list(range(engine._layout.pool.num_total)), 0.0)
    gc.collect()
    before = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM (the peak RSS) to the RSS now
    restored = engine.restore_session(path)
    peak = status("VmHWM")
    table = engine._scheduler.cache.get(restored.conv_id).table
    ok = all(
        bool((t[:, i * CHUNK : i * CHUNK + 1] == conv_id_pattern).all())
        for layer, parts in enumerate(layer_parts(engine._kv))
        for t in parts
        for i in table.chunk_ids[:: max(1, len(table.chunk_ids) // 5)]
        for conv_id_pattern in [torch.tensor(float(i + 1000 * layer))]
    )
    print(json.dumps({"before": before, "peak": peak, "file_bytes": saved.num_bytes, "num_cells": restored.num_cells,
                      "chunk_bytes": CHUNK * engine._kv.bytes_per_cell, "kv_bytes": engine._kv.num_bytes,
                      "pattern_ok": ok, "restore_s": restored.seconds}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

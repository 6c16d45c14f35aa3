"""Part 7: one decoding lane whose chunks are scattered in runs (a pool conversation that grew
between other lanes' chunks, where placement could not keep it contiguous): one layer's
decode attention read run by run (in place, merged by log-sum-exp) against gathered (its
cells copied into one tensor first), through the runner's inputs and the model's attention.
Both reads of each shape alternate in one process; medians of CPU time (one thread, so a
busy shared machine slows the wall clock more than this) and of wall time."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

from benchmarks.common import print_table

if TYPE_CHECKING:
    from benchmarks.pool import Run

RUNS_CELLS = 32768
RUN_COUNTS = (1, 2, 8, 32, 128, 512)
RUN_CHUNKS = (4096, 256, 64)  # counts a chunk size cannot make (more runs than chunks) are skipped


def arm_runs(p: dict) -> dict:
    import torch

    from strata.models.attention import attend
    from strata.runner.inputs import build_inputs
    from strata.runner import reads
    from strata.cells.dense import DenseCells
    from strata.runner.reads import ChunkCells
    from strata.step import LaneWork

    torch.set_num_threads(1)
    kv_heads, heads, dim, cells = 3, 9, 64, p["cells"]  # SmolLM2-135M's attention
    g = torch.Generator().manual_seed(5)
    rows = []
    for chunk in p["chunks"]:
        need = -(-cells // chunk)
        num_chunks = 2 * need + 2
        k = DenseCells(torch.randn(kv_heads, num_chunks * chunk, dim, generator=g).bfloat16())
        v = DenseCells(torch.randn(kv_heads, num_chunks * chunk, dim, generator=g).bfloat16())
        q = torch.randn(1, heads, dim, generator=g).bfloat16()
        kn, vn = torch.randn(1, kv_heads, dim).bfloat16(), torch.randn(1, kv_heads, dim).bfloat16()
        for runs in p["runs"]:
            if runs > need:
                continue
            per, ids, at = -(-need // runs), [], 0
            while len(ids) < need:  # runs of `per` chunks, one free chunk between runs
                ids += range(at, at + min(per, need - len(ids)))
                at = ids[-1] + 2
            w = LaneWork(0, "r", (1,), cells - 1, tuple(ids), True)
            bounded = ChunkCells(chunk, num_chunks * chunk, runs_min_cells=1)
            picked = build_inputs([w], bounded).meta.decode[0]  # what the engine's rule reads
            max_runs, reads.MAX_RUNS = reads.MAX_RUNS, 1 << 30  # run by run, whatever the rule says
            try:
                metas = {"run by run": build_inputs([w], bounded).meta,
                         "gathered": build_inputs([w], ChunkCells(chunk, None)).meta}  # no bound: gathered
            finally:
                reads.MAX_RUNS = max_runs
            kind = {"runs": "runs", "contiguous": "in place"}.get(picked.kind, "gathered")
            cpu: dict[str, list[float]] = {name: [] for name in metas}
            wall: dict[str, list[float]] = {name: [] for name in metas}
            for rep in range(p["reps"]):
                for name in (list(metas) if rep % 2 == 0 else list(metas)[::-1]):
                    t, tc = time.perf_counter(), time.process_time()
                    attend(q, kn, vn, k, v, metas[name])
                    cpu[name].append(time.process_time() - tc)
                    wall[name].append(time.perf_counter() - t)
            rows.append({"chunk": chunk, "runs": len(set(i - n for n, i in enumerate(ids))), "cells": cells,
                         "picked": kind, "cpu_ms": {n: 1e3 * statistics.median(x) for n, x in cpu.items()},
                         "wall_ms": {n: 1e3 * statistics.median(x) for n, x in wall.items()}})
    return {"rows": rows}


def measure(run: Run) -> None:
    a = run.args
    p = {**run.base(a.scale), "cells": RUNS_CELLS // a.scale, "runs": list(RUN_COUNTS),
         "chunks": [max(16, c // a.scale) for c in RUN_CHUNKS], "reps": 15 if a.quick else 41}
    res = run.child("runs", p)
    run.payload["runs"] = {"params": p, "raw": res}
    if res is None:
        return
    rows = []
    for r in res["rows"]:
        c, w = r["cpu_ms"], r["wall_ms"]
        rows.append([r["chunk"], r["runs"], r["cells"] // r["runs"], r["picked"],
                     c["run by run"], c["gathered"], c["run by run"] / c["gathered"],
                     w["run by run"] / w["gathered"]])
    title = (f"7. one decoding lane of {p['cells']} cells in scattered runs (one free chunk between runs): one "
             f"layer's decode attention (3 K/V heads of 64, bf16, 1 thread), read run by run vs gathered; "
             f"medians of {p['reps']} alternating calls; 'read as' is what the engine's rule picks")
    run.tables["runs"] = print_table(
        title, ["chunk", "runs", "cells per run", "read as", "run by run CPU ms", "gathered CPU ms",
                "run by run / gathered (CPU)", "(wall)"], rows)

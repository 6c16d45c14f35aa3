"""The shared KV pool against the reserved layout: lane moves, idle memory, cached follow-ups, decode.

Reproduces, on this machine and with the default model's K/V geometry (SmolLM2-135M:
30 layers, 3 K/V heads of 64, bf16 = 22.5 KiB per token), the claims the pool was
proposed with (seed thread #3351), both layouts side by side in one run:

1. move: the time `Engine.move` takes to move an idle conversation between lanes, against
   its length (1K .. 256K cells). Reserved copies every cell; the pool hands the chunk
   table over. Conversations are held with `Engine.restore` and their K/V is SYNTHETIC
   (written straight into the storage through the chunk table). Targets: the swap under
   1 ms and flat in length, copy / swap > 1000x at 256K.
2. memory: two lanes at --max-context 262144, each layout in its own process: committed
   K/V bytes, RSS and the MemAvailable drop after start (the pool at its smallest valid
   --kv-pool-tokens, which holds one --max-context conversation). Then how many ~104K-cell
   conversations each layout holds in the reserved layout's K/V memory, measured alike in
   each (conversations restored one at a time until one makes an earlier one give way,
   synthetic K/V; a short turn appended to each one held and decoded together); the
   pool's count is checked against its chunk counts.
3. ttft: time to first token of a short question appended to a cached ~8K-token
   conversation against a cold prefill of the same tokens, on the real model at its
   trained length (real prefills, no synthetic K/V). Both layouts' engines in one
   process, interleaved request by request (see `pool_parts/ttft.py`).
4. decode: two conversations of 32K SYNTHETIC cells each (beyond the model's trained length
   of 8192: allowed for measurement, quality is meaningless), each extended by a short turn
   (the turn is prefilled for real on top of the synthetic K/V), both lanes decoding
   together; tok/s per layout and pool / reserved. Both layouts' engines in one process,
   stepped alternately.

5. prefix: identical prefixes, scheduler only (chunk ids, no model): admission time with
   10, 100, 1000 parked conversations of 2K tokens, the radix-tree prefix index against
   the linear scan it replaced (kept in the part as the "before" arm); chunks held by
   N = 1, 4, 16 conversations sharing a 2K-token system prompt, with and without sharing
   (see `pool_parts/prefix.py`). `prefix_ttft`: the same with the real model, TTFT of each
   new conversation with and without sharing (`pool_parts/prefix_ttft.py`).

6. kv_int8: bf16 against int8 K/V: how many conversations of 1K..32K cells a 4 GiB pool
   holds (from the engines' real bytes per cell), and decode tok/s at two context lengths
   (real prefills, both K/V dtypes in one process; see `pool_parts/kv_int8.py`).

7. runs: one decoding lane of 32K cells whose chunks are scattered in 1..512 runs, one
   layer's decode attention read run by run against gathered (see `pool_parts/runs.py`):
   where chunk placement cannot keep a conversation contiguous, what reading it in place saves.

    python benchmarks/pool.py [--quick] [--scale S] [--only move,memory,ttft,decode,prefix,prefix_ttft,kv_int8,runs]

`--scale S` divides every length and size (contexts, chunk, pool) by S; `--quick` is
`--scale 64` (unless given) with fewer repetitions and rounds. Before every arm the
script compares what the arm will commit with MemAvailable and, when it is short, runs
that part at a larger scale and says so. Arms run one at a time, each in a fresh
interpreter; the TTFT and decode arms hold both layouts' engines in one interpreter and
interleave them, which keeps the comparison fair on a machine other processes share
(with 2 torch threads on 2 cores, a busy neighbour makes every parallel region wait for
a time slice: timings swing several-fold; each result keeps the CPU load it started
under, and the move and decode tables add the best run next to the median).
Raw numbers and tables go to benchmarks/results/pool.json (pool-quick.json for
--quick; a partial run, `--only decode`, to pool-decode.json with only its own parts),
and a PNG of move time against length when matplotlib is importable.

This file parses the arguments, runs the parts and writes the results; each part's arm
(run as `pool.py --arm NAME`) and its tables live in benchmarks/pool_parts/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import RESULTS_DIR, available_mib, run_arm, wait_for_quiet, write_json
from benchmarks.pool_parts import (
    BYTES_PER_CELL,
    CHUNK,
    GIB,
    HEADROOM,
    KIB,
    MIB,
    decode,
    kv_int8,
    memory,
    move,
    prefix,
    prefix_ttft,
    runs,
    ttft,
)

ALL_PARTS = {"move", "memory", "ttft", "decode", "prefix", "prefix_ttft", "kv_int8", "runs"}
ARMS = {"move": move.arm_move, "capacity": memory.arm_capacity, "ttft": ttft.arm_ttft, "decode": decode.arm_decode,
        "prefix": prefix.arm_prefix, "prefix_ttft": prefix_ttft.arm_prefix_ttft, "kv_int8": kv_int8.arm_kv_int8,
        "runs": runs.arm_runs}


# ---- the parent: memory checks, child arms, notes; each part's tables are in benchmarks/pool_parts ----
class Run:
    """The parent's state: args, notes, tables and the JSON payload, and the plumbing every part uses."""

    def __init__(self, args):
        self.args = args
        self.notes: list[str] = []
        self.payload: dict = {"args": vars(args), "notes": self.notes, "bytes_per_cell_assumed": BYTES_PER_CELL}
        self.tables: dict[str, str] = {}
        self.busy_starts = 0

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"note: {text}", file=sys.stderr)

    def fit(self, part: str, need_at, scale: int) -> int:
        """The smallest scale >= `scale` (doubling) at which `need_at(scale)` bytes fit in MemAvailable."""
        avail = available_mib() * MIB
        s = scale
        while need_at(s) + HEADROOM > avail and s < 4096:
            s *= 2
        if s != scale:
            self.note(f"{part}: needs {need_at(scale) / GIB:.2f} GiB at scale {scale} but only "
                      f"{avail / GIB:.2f} GiB is available (keeping {HEADROOM / GIB:.0f} GiB free): ran at "
                      f"scale {s} instead")
        print(f"[{part}] MemAvailable {avail / GIB:.2f} GiB, this arm needs about "
              f"{need_at(s) / GIB:.2f} GiB (scale {s})", file=sys.stderr)
        return s

    def enough(self, what: str, need: int) -> bool:
        """Whether `need` bytes fit in MemAvailable now (checked before every big arm); notes a skip."""
        avail = available_mib() * MIB
        if need + HEADROOM <= avail:
            return True
        self.note(f"{what}: skipped, needs {need / GIB:.2f} GiB and {avail / GIB:.2f} GiB is available")
        return False

    def wait_quiet(self) -> dict:
        """Before each arm, waits (up to --quiet-wait s) for other processes to leave the CPUs mostly idle;
        what the CPUs were doing is kept with the arm's result, and arms started busy are counted."""
        quiet = wait_for_quiet(self.args.quiet_wait, self.args.quiet_cpu)
        if not quiet["quiet"]:
            self.busy_starts += 1
        return quiet

    def child(self, arm: str, params: dict) -> dict | None:
        quiet = self.wait_quiet()
        try:
            res = run_arm(__file__, arm, ["--params", json.dumps(params)], timeout=self.args.timeout)
        except Exception as exc:  # noqa: BLE001 - a failed arm (memory, a bug) is reported, the rest still runs
            self.note(f"arm {arm} {params.get('layout', '')} failed: {str(exc)[-1500:]}")
            return None
        res["machine_at_start"] = quiet
        res["loadavg_1m_at_end"] = os.getloadavg()[0]
        return res

    def base(self, scale: int) -> dict:
        return {"threads": self.args.threads, "chunk": max(16, CHUNK // scale), "scale": scale}

    def plot(self, curve: dict, p: dict, bpc: int) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            self.note("matplotlib is not installed in the venv: the move-time plot is skipped "
                      "(the curve is in pool.json under move.curve)")
            return
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.loglog(curve["cells"], curve["reserved_ms"], "o-", label="reserved: copy")
        ax.loglog(curve["cells"], curve["pool_ms"], "s-", label="pool: table swap")
        ax.axhline(1.0, color="grey", ls=":", lw=1, label="1 ms")
        ax.set_xlabel("conversation length (cells)")
        ax.set_ylabel("Engine.move time (ms, median)")
        ax.set_title(f"lane move, {bpc / KIB:.1f} KiB/cell, chunk {p['chunk']} (synthetic K/V)")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        path = os.path.join(self.args.out, "pool-move-quick.png" if self.args.quick else "pool-move.png")
        os.makedirs(self.args.out, exist_ok=True)
        fig.savefig(path, dpi=120, bbox_inches="tight")
        self.payload["plot"] = path
        print(f"plot: {path}")


def results_name(parts: set[str], quick: bool) -> str:
    """pool.json for a full run; a partial run (--only) writes only what it measured, to a file
    named for its parts (pool-decode.json), so no number in a file is older than the file."""
    only = "" if parts == ALL_PARTS else "-" + "-".join(sorted(parts))
    return f"pool{'-quick' if quick else ''}{only}.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", choices=sorted(ARMS))
    p.add_argument("--params", help="(children) the arm's parameters as JSON")
    p.add_argument("--quick", action="store_true", help="scale 64 (unless --scale), fewer repetitions and rounds")
    p.add_argument("--scale", type=int, help="divide every length and size by this (default 1; 64 with --quick)")
    p.add_argument("--only", default="move,memory,ttft,decode,prefix,prefix_ttft,kv_int8,runs",
                   help="parts to run (move includes idle memory)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--reps", type=int, help="moves per length per process (default 7; 1 with --quick)")
    p.add_argument("--rounds", type=int, help="move/memory processes per layout (default 3; 1 with --quick)")
    p.add_argument("--ttft-rounds", type=int, help="cached follow-ups per layout (default 5; 1 with --quick)")
    p.add_argument("--prefill-chunk", type=int, help="TTFT arm's --prefill-chunk (default: the whole context)")
    p.add_argument("--decode-rounds", type=int, help="turns each decode lane takes (default 3; 1 with --quick)")
    p.add_argument("--new", type=int, help="new tokens per lane in the decode arm (default 16; 4 with --quick)")
    p.add_argument("--capacity-new", type=int, default=2, help="tokens each held conversation decodes in 2b")
    p.add_argument("--quiet-wait", type=float, help="seconds to wait before each arm for the CPUs to be "
                   "mostly idle (default 180; 0 with --quick)")
    p.add_argument("--quiet-cpu", type=float, default=25.0, help="host CPU %% counted as mostly idle")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one arm may run")
    p.add_argument("--out", default=RESULTS_DIR, help=f"directory for the JSON and the PNG (default {RESULTS_DIR})")
    args = p.parse_args()
    if args.arm:
        print(json.dumps(ARMS[args.arm](json.loads(args.params))))
        return
    q = args.quick
    args.scale = args.scale or (64 if q else 1)
    args.reps = args.reps or (1 if q else 7)
    args.rounds = args.rounds or (1 if q else 3)
    args.ttft_rounds = args.ttft_rounds or (1 if q else 5)
    args.decode_rounds = args.decode_rounds or (1 if q else 3)
    args.new = args.new or (4 if q else 16)
    args.quiet_wait = args.quiet_wait if args.quiet_wait is not None else (0 if q else 180)
    parts = {x.strip() for x in args.only.split(",") if x.strip()}
    if parts - ALL_PARTS:
        p.error(f"--only: unknown part(s) {', '.join(sorted(parts - ALL_PARTS))}")

    run = Run(args)
    import psutil

    vm = psutil.virtual_memory()
    run.payload["machine"] = {"cpus": os.cpu_count(), "threads": args.threads, "mem_total_gib": vm.total / GIB,
                              "mem_available_gib_at_start": vm.available / GIB}
    print(f"machine: {os.cpu_count()} CPUs, {vm.total / GIB:.1f} GiB RAM, {vm.available / GIB:.1f} GiB available; "
          f"scale {args.scale}{' (quick)' if q else ''}", file=sys.stderr)
    if args.scale != 1:
        run.note(f"scaled run: every length and size is divided by {args.scale} "
                 f"(kv-chunk {max(16, CHUNK // args.scale)})")
    run.note("moves, idle memory, capacity and decode use SYNTHETIC K/V written into the storage through each "
             "conversation's chunk table (Engine.restore); only the TTFT arm prefills for real")
    t0 = time.perf_counter()
    if parts & {"move", "memory"}:
        moved = move.measure(run)  # parts 1 and 2a share the move arms
        if moved is not None:
            raw, params, curve, bpc = moved
            run.plot(curve, params, bpc)
            memory.idle(run, raw, params)
    if "memory" in parts:
        memory.capacity(run)
    if "ttft" in parts:
        ttft.measure(run)
    if "decode" in parts:
        decode.measure(run)
    if "prefix" in parts:
        prefix.measure(run)
    if "prefix_ttft" in parts:
        prefix_ttft.measure(run)
    if "kv_int8" in parts:
        kv_int8.measure(run)
    if "runs" in parts:
        runs.measure(run)
    if run.busy_starts:
        run.note(f"{run.busy_starts} arm(s) started while other processes kept the CPUs over {args.quiet_cpu:.0f} % "
                 f"busy (after waiting up to {args.quiet_wait:.0f} s): their timings are inflated by contention; "
                 f"see machine_at_start / loadavg_1m_at_end in each raw result")
    run.payload["tables"] = run.tables
    run.payload["seconds"] = time.perf_counter() - t0
    path = write_json(results_name(parts, q), run.payload, args.out)
    if run.notes:
        print("\nnotes:\n" + "\n".join(f"- {n}" for n in run.notes))
    print(f"raw numbers: {path} ({run.payload['seconds']:.0f} s)")
    failed = [n for n in run.notes if n.startswith("arm ") and " failed: " in n]
    if failed:  # what failed is in the notes above; the run's exit says so too
        sys.exit(f"{len(failed)} arm(s) failed")


if __name__ == "__main__":
    main()

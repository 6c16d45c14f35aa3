"""Session files: save and restore time and MB/s against conversation length, next to
recomputing the prefill of the same tokens (and llama-server's slot save/restore, where
a llama-server binary is built: benchmarks/serve_parts finds it).

On the default model's K/V geometry (SmolLM2-135M: 30 layers, 3 K/V heads of 64, bf16 =
22.5 KiB per cell), for conversations of 1K .. 128K cells. The K/V is SYNTHETIC (written
straight into the pool through the chunk table, `pool_parts/synthetic.py`): a prefill of
128K tokens takes far too long on 2 cores, and past 8K cells the model is beyond its
trained length anyway. Every restore is checked against what was saved.

Arms, interleaved round by round at each length (medians over --rounds):
- save: `Engine.save_session` (stream chunk by chunk, CRC-32 each, write, fsync, rename);
- restore cold: `Engine.restore_session` after the file's pages were dropped from the
  page cache (posix_fadvise DONTNEED on the fsynced file): disk to pool;
- restore warm: the same with the file in the page cache;
- prefill: a real prefill of the same number of tokens (random ids) on the real model,
  only up to --prefill-max cells (longer ones are left out: minutes each here);
- llama-server: not written yet. The script looks for a built binary the way
  benchmarks/serve_parts does and says whether one was found; none can be built or
  fetched on these machines, so an arm that drives its /slots save and restore has
  never run and is left out rather than shipped untested.
The restore's peak extra RSS (VmHWM, reset before the restore, minus the RSS before) is
in the table, next to the session's size.

Then the stall table (session_parts/stall.py): a decoding stream's worst gap between tokens
while a conversation of --stall-cells (1 GiB of K/V by default) is saved, then restored,
over its median gap, for the file streamed inline (the engine waits for it between two
steps, as before) and off the step path (a worker thread streams it while the engine steps),
next to the same windows without any file (the machine's own noise).

    python benchmarks/session.py [--lengths 1024,4096,...] [--rounds 3] [--threads 1] [--prefill-max 4096]
                                 [--stall-cells 46603] [--stall-rounds 2] [--arms none,inline,offpath]

`--lengths ""` skips the first table, `--stall-cells 0` the second; `--arms inline` runs on a
tree whose engine has no `begin_save_session` (what was measured before). Writes
benchmarks/results/session.json and session.png (or under --out). `--quick`: 256 and 1024
cells in chunks of 256, one round; a stall table of 2048 cells, one round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, print_table, wait_for_quiet, write_json  # noqa: E402
from benchmarks.serve_parts.servers import find_llama_server  # noqa: E402
from benchmarks.session_parts.arms import SessionArms  # noqa: E402
from benchmarks.session_parts.plot import plot  # noqa: E402
from benchmarks.session_parts.stall import StallArms  # noqa: E402

MIB = 1 << 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1024,4096,16384,32768,65536,131072")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: copies do not wait on a busy core)")
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--prefill-max", type=int, default=4096, help="longest real prefill measured")
    ap.add_argument("--dir", default=None, help="where the session files go (default: a temporary directory)")
    ap.add_argument("--stall-cells", type=int, default=(1 << 30) // 23040, help="the stall table's conversation")
    ap.add_argument("--stall-rounds", type=int, default=2)
    ap.add_argument("--arms", default="none,inline,offpath", help="the stall table's arms")
    add_quick_and_out(ap, "256 and 1024 cells in chunks of 256, 1 round; a 2048-cell stall table")
    args = ap.parse_args()
    if args.quick:
        args.lengths, args.rounds, args.chunk, args.prefill_max = "256,1024", 1, 256, 1024
        args.stall_cells, args.stall_rounds = 2048, 1
    lengths = [int(x) for x in args.lengths.split(",") if x]
    quiet = wait_for_quiet(0 if args.quick else 60)
    stall = stall_table(args) if args.stall_cells else None
    if not lengths:
        path = write_json("session_stall.json", {"args": vars(args), "host": quiet, "stall": stall}, args.out)
        print(f"wrote {path}")
        return 0
    llama = find_llama_server()
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        arms = SessionArms(max(lengths), args.chunk, args.threads, work)
        rows = {n: {"save": [], "restore_cold": [], "restore_warm": [], "prefill": []} for n in lengths}
        for r in range(args.rounds):
            for n in lengths:
                res = arms.round(n, prefill=n <= args.prefill_max)
                for k, v in res.items():
                    rows[n][k].append(v)
                print(f"  round {r + 1}/{args.rounds} {n} cells: save {res['save']['s']:.3f} s, restore cold "
                      f"{res['restore_cold']['s']:.3f} s", file=sys.stderr)
    table, summary = [], {}
    for n in lengths:
        med = {k: {f: statistics.median(x[f] for x in v) for f in v[0]} if v else None for k, v in rows[n].items()}
        summary[n] = med
        size = med["save"]["bytes"]
        prefill = med["prefill"]["s"] if med["prefill"] else None
        table.append([
            n, size / MIB, med["save"]["s"] * 1e3, size / MIB / med["save"]["s"],
            med["restore_cold"]["s"] * 1e3, size / MIB / med["restore_cold"]["s"],
            med["restore_warm"]["s"] * 1e3, med["restore_cold"]["peak_extra_bytes"] / MIB,
            "not measured" if prefill is None else prefill * 1e3,
            "-" if prefill is None else prefill / med["restore_cold"]["s"],
        ])
    cols = ["cells", "file MiB", "save ms", "save MB/s", "restore cold ms", "restore MB/s", "restore warm ms",
            "restore peak extra RSS MiB", "prefill ms", "prefill / restore"]
    text = print_table("Session files (synthetic K/V, SmolLM2-135M geometry, bf16; medians)", cols, table)
    note = (f"llama-server: found at {llama}, but this script has no arm that drives it yet" if llama else
            "llama-server: not found (benchmarks/serve_parts looks for /tmp/llamacpp/**/build/bin/llama-server); "
            "no llama-server arm was run")
    print(note)
    path = write_json("session.json", {"args": vars(args), "host": quiet, "table": text, "note": note, "stall": stall,
                                       "rounds": {str(n): rows[n] for n in lengths},
                                       "medians": {str(n): summary[n] for n in lengths}}, args.out)
    png = os.path.join(args.out, "session.png")
    plot(summary, lengths, png)
    print(f"wrote {path} and {png}")
    return 0


def stall_table(args) -> dict:
    arms = [a for a in args.arms.split(",") if a]
    rows: dict[str, list[dict]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        bench = StallArms(args.stall_cells, args.chunk, args.threads, work)
        for r in range(args.stall_rounds):
            for arm in arms:
                res = bench.round(arm)
                rows[arm].append(res)
                print(f"  stall round {r + 1}/{args.stall_rounds} {arm}: save worst/median "
                      f"{res['save']['ratio']:.2f}, restore {res['restore']['ratio']:.2f}", file=sys.stderr)
    table = []
    size = max(x["bytes"] for runs in rows.values() for x in runs)
    for arm in arms:
        for what in ("save", "restore"):
            runs = [x[what] for x in rows[arm]]
            med = {k: statistics.median(x[k] for x in runs) for k in ("s", "median_gap_s", "worst_gap_s", "ratio")}
            table.append([arm, what, "-" if arm == "none" else size / MIB, med["s"], med["median_gap_s"] * 1e3, med["worst_gap_s"] * 1e3,
                          med["ratio"], statistics.median(x["tokens_during"] for x in runs)])
    cols = ["arm", "file", "MiB", "seconds", "median gap ms", "worst gap ms", "worst / median", "tokens during"]
    text = print_table(f"A decoding stream while a {args.stall_cells:,}-cell conversation streams "
                       f"(medians of {args.stall_rounds} rounds)", cols, table)
    for runs in rows.values():
        for x in runs:
            for what in ("save", "restore"):
                x[what].pop("result", None)
    return {"table": text, "rounds": rows}


if __name__ == "__main__":
    sys.exit(main())

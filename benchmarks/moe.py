"""Mixture-of-experts speed: prefill and decode (1 and 8 lanes) on a random-weight MoE GGUF.

The file (benchmarks/moe_parts/speed.py) is OLMoE-1B-7B's shape scaled to fit here (64
experts, top 8; `--shape`), written once into `--out` with random `--qtype` weights and the
default model's tokenizer. Arms: strata `--weights auto`, `native` and `dense`, and llama.cpp
on the same file where llama-cpp-python is installed (`--peers llama.cpp`); each runs in its
own interpreter through benchmarks/decode.py's arms (same token ids, bf16 compute, the same
thread count), interleaved over `--rounds`, and the table shows medians and each arm's ratio
to strata --weights auto (and to llama.cpp where it ran).

    python benchmarks/moe.py [--shape olmoe-scaled] [--qtype Q4_0] [--rounds 3] [--prompt 256] [--new 64]
                             [--threads 2] [--strata auto,native,dense] [--peers llama.cpp] [--quick]

`--quick`: the small shape (2 layers, hidden 256), a 32-token prompt, 4 new tokens, one round,
strata's arms only.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, cpu_name, interleaved, medians, print_table, run_arm, write_json
from benchmarks.decode import METRICS, STRATA_ARMS, all_prompts, labels
from benchmarks.moe_parts.speed import SHAPES, describe, plot_speed, write_moe_gguf

DECODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "decode.py")
MOE_STRATA = ("auto", "native", "dense")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="olmoe-scaled")
    p.add_argument("--qtype", choices=["Q4_0", "Q8_0"], default="Q4_0", help="every 2-D weight's type")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--strata", default=",".join(MOE_STRATA), help="strata rows: auto, native, dense (--weights)")
    p.add_argument("--peers", default="llama.cpp", help="peer rows: llama.cpp (or none: '')")
    add_quick_and_out(p, "the small shape, strata's arms only, 32-token prompt, 4 new tokens, 1 round")
    args = p.parse_args()
    if args.quick:
        args.shape, args.prompt, args.new, args.rounds, args.peers = "quick", 32, 4, 1, ""
        print("--quick: strata's arms only; llama.cpp was not run")
    chosen = [x.strip() for x in args.strata.split(",") if x.strip()]
    if not chosen or set(chosen) - set(MOE_STRATA):
        p.error(f"--strata: choose from {', '.join(MOE_STRATA)} (got {args.strata!r})")
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    if set(peers) - {"llama.cpp"}:
        p.error(f"--peers: only llama.cpp (got {args.peers!r})")
    arms = [STRATA_ARMS[x] for x in MOE_STRATA if x in chosen]
    if peers:
        try:
            import llama_cpp  # noqa: F401

            arms.append("llama.cpp")
        except ImportError:
            print("llama.cpp: llama-cpp-python is not installed; its arm is left out", file=sys.stderr)
    from strata.loader.default import default_model_path

    shape = SHAPES[args.shape]
    os.makedirs(args.out, exist_ok=True)
    model = write_moe_gguf(os.path.join(args.out, f"moe-{args.shape}-{args.qtype}.gguf"), shape, args.qtype,
                           default_model_path())
    prompts = write_json("moe-prompts.json", all_prompts(model, args.prompt), args.out)
    passthrough = ["--model", model, "--prompts", prompts, "--prompt", str(args.prompt), "--new", str(args.new),
                   "--threads", str(args.threads)]
    load_before = os.getloadavg()
    raw = interleaved(arms, args.rounds, lambda arm: run_arm(DECODE, arm, passthrough))
    med = {arm: medians(rows) for arm, rows in raw.items()}
    names = labels(f"random {args.qtype}")
    rows = [[names[a]] + [med[a][m] for m in METRICS] for a in arms]
    for base in ("strata", "llama.cpp"):
        for a in arms:
            if base in med and a != base:
                rows.append([f"{names[a]} / {names[base]}"] + [med[a][m] / med[base][m] for m in METRICS])
    title = (f"moe benchmark: random-weight {describe(shape)}, {args.qtype}; {args.prompt}-token prompt, {args.new} "
             f"new tokens, {args.threads} threads, bf16 compute, median of {args.rounds} interleaved rounds on "
             f"{cpu_name()}; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
    table = print_table(title, ["arm", "prefill tok/s", "decode tok/s (1 lane)", "decode tok/s (8 lanes)", "load s",
                                "peak RSS MiB", "peak RSS over runtime MiB"], rows)
    stem = "moe" if not args.quick else "moe-quick"
    path = write_json(f"{stem}.json", {"args": vars(args), "shape": shape, "raw": raw, "median": med, "table": table,
                                       "loadavg": [load_before, os.getloadavg()]}, args.out)
    plot_speed(med, names, os.path.splitext(path)[0] + ".png",
               f"moe.py: random {describe(shape)}, {args.qtype}\n{args.prompt}-token prompt, {args.threads} "
               f"threads, bf16 compute, one run on {cpu_name()} (load average {load_before[0]:.1f})")
    print(f"raw numbers: {path} (plot: {os.path.basename(os.path.splitext(path)[0])}.png next to it)")


if __name__ == "__main__":
    main()

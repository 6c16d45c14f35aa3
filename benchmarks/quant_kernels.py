"""Quantized projections at decode row counts: strata's kernels against torch's own.

For one decoder layer of the default model (q|k|v 960 x 576, o 576 x 576, gate|up 3072 x
576, down 576 x 1536; `--layer` for others: the K-quants need rows of multiples of 256) and
its LM head (49152 x 576), at 1, 2, 4 and 8 rows (and 16, 64 for where a prompt piece starts to
prefer dense weights), this times:

- strata int8: `quant_matmul` with 8-bit activations (what bfloat16 compute runs), per type;
- strata x8: Q4_0/Q4_1 blocks with 8 columns interleaved (models/q4x8.py), 15-bit activations
  (the default) or 8-bit ones (STRATA_Q4_KERNEL=x8-int8); q8x8: Q8_0 blocks the same way;
- strata float: `quant_matmul` with float32 activations (what float32 compute runs);
- torch int4: `torch._weight_int4pack_mm_for_cpu`, the kernel Q4_0/Q4_1 used before
  (group 32, w = (q - 8) * scale + zero: Q4_0, Q4_1 and Q4_K's per-32 scale/min fit it);
- torch int8 rows: `torch._weight_int8pack_mm`, per-row int8 (the bfloat16 LM head's form);
- dense: `F.linear` on bfloat16 and float32 weights (torch's oneDNN GEMM; AMX where present).

Weights are random blocks of each type (speed does not depend on the values). Every
arm runs in this process, interleaved; a projection's time is the median of `--reps` calls,
a layer's the sum of its projections', and the table reports the median of `--rounds`
layer times in microseconds and each arm's ratio to dense bfloat16.

    python benchmarks/quant_kernels.py [--threads 2] [--rounds 5] [--isa auto|avx2|avx_vnni|avx512_vnni] [--head]
                                       [--copies N] [--clock cpu] [--quick] [--out DIR]

`--copies N` makes N copies of every arm's weights and calls them in turn, so with enough of
them (64 for one layer) the weights stream from memory as in a decode step, where one copy stays
in the caches. `--clock cpu` times one thread's CPU time (time.thread_time; it implies --threads 1): on a
shared machine, wall time also counts the slices other processes take from the threads.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, cpu_name, print_table, pyplot, write_json

HEAD = (49152, 576)


def layer_shapes(hidden: int, kv: int, ffn: int) -> dict[str, tuple[int, int]]:
    """[out, in] of one decoder layer's projections (q|k|v and gate|up fused)."""
    return {"qkv": (hidden + 2 * kv, hidden), "o": (hidden, hidden), "gate_up": (2 * ffn, hidden), "down": (hidden, ffn)}


LAYER = layer_shapes(576, 192, 1536)  # the default model
ROWS = (1, 2, 4, 8, 16, 64)
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
BLOCK = {2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 12: (256, 144), 13: (256, 176),
         14: (256, 210)}


def random_blocks(qtype: int, out: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    """uint8 [out, row bytes] of random codes with small finite float16 scales."""
    values, size = BLOCK[qtype]
    raw = rng.integers(0, 256, size=(out, k // values, size), dtype=np.uint8)
    scale = rng.uniform(1e-3, 2e-3, size=raw.shape[:2] + (2,)).astype(np.float16).view(np.uint8)
    if qtype == 14:
        raw[..., -2:] = scale[..., :2]
    else:
        raw[..., 0:4] = scale
    return torch.from_numpy(raw.reshape(out, -1))


def timed(fn, reps: int, clock=time.perf_counter) -> float:
    """The median of `reps` single calls, microseconds (a shared machine: one call descheduled
    by another process's work does not move it)."""
    fn()
    times = []
    for _ in range(reps):
        t = clock()
        fn()
        times.append(clock() - t)
    return statistics.median(times) * 1e6


def arms_for(shapes: dict, ops, rng, keep=lambda arm: True) -> dict[str, list]:
    """arm -> [(in features, fn(x_bf16, x_f32))], one per projection of `shapes`, for "dense bf16"
    and the arms `keep` names (weights are made only for those)."""
    from strata.models.head import Int8Rows

    arms: dict[str, list] = {}

    def add(name: str, make) -> None:  # make(out, k) -> fn(x_bf16, x_f32), per projection
        if name == "dense bf16" or keep(name):
            arms[name] = [(k, make(out, k)) for out, k in shapes.values()]

    def int4(out, k, dtype):  # torch's int4 pack and its [k / 32, out, 2] scales and zeros in `dtype`
        packed = torch._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (out, k), dtype=torch.int32), 1)
        return packed, (torch.rand(k // 32, out, 2) * 0.01).to(dtype)

    add("dense bf16", lambda out, k: (lambda xb, xf, w=(torch.randn(out, k) * 0.02).bfloat16(): F.linear(xb, w)))
    add("dense f32", lambda out, k: (lambda xb, xf, w=(torch.randn(out, k) * 0.02).bfloat16().float(): F.linear(xf, w)))
    add("torch int4 bf16", lambda out, k: (lambda xb, xf, ps=int4(out, k, torch.bfloat16):
                                            torch._weight_int4pack_mm_for_cpu(xb, ps[0], 32, ps[1])))
    add("torch int4 f32", lambda out, k: (lambda xb, xf, ps=int4(out, k, torch.float32):
                                           torch._weight_int4pack_mm_for_cpu(xf, ps[0], 32, ps[1])))
    add("torch int8 rows bf16", lambda out, k: (  # the int8 LM head's form (models/head.py)
        lambda xb, xf, r=Int8Rows.quantize((torch.randn(out, k) * 0.02).bfloat16()):
        torch._weight_int8pack_mm(xb, r.codes, r.scale)))
    if ops is None:
        return arms
    from strata.models.q4x8 import X8Matmul
    from strata.models.quant import QuantWeight

    def blocks(qtype, out, k):
        return [QuantWeight(random_blocks(qtype, out, k, rng), qtype, k)]

    # activation bits: 15 the default, 8 STRATA_Q4_KERNEL=x8-int8
    for name, qtype in (("Q4_0", 2), ("Q4_1", 3)):  # the x8 form of the same blocks (models/q4x8.py)
        for bits in (15, 8):
            add(f"strata x8 {name} {bits}-bit act",
                lambda out, k, t=qtype, b=bits: (lambda xb, xf, m=X8Matmul.from_parts(blocks(t, out, k), b): m(xb)))
    for bits in (15, 8):  # Q8_0 in the q8x8 form (the LM head's, STRATA_HEAD_KERNEL=x8)
        add(f"strata q8x8 Q8_0 {bits}-bit act",
            lambda out, k, b=bits: (lambda xb, xf, m=X8Matmul.from_q8x8_parts(blocks(8, out, k), b): m(xb)))
    for bits in (15, 8):  # Q5_0 in the q5x8 form (its own 22 bytes per block: models/linear.py)
        add(f"strata q5x8 Q5_0 {bits}-bit act",
            lambda out, k, b=bits: (lambda xb, xf, m=X8Matmul.from_q5x8_parts(blocks(6, out, k), b): m(xb)))
    for name, qtype in TYPES.items():
        if any(k % BLOCK[qtype][0] for _, k in shapes.values()):
            continue
        for path, int8 in (("int8", True), ("float", False)):
            add(f"strata {path} {name}", lambda out, k, t=qtype, i=int8: (
                lambda xb, xf, w=random_blocks(t, out, k, rng): ops.quant_matmul(xb if i else xf, [w], [t], i)))
    return arms


def in_turn(copies: list[list]) -> list:
    """One arm's projections from its copies' (`copies[c][j]`: copy c's projection j): each call
    of projection j runs the next copy's."""
    if len(copies) == 1:
        return copies[0]
    turns = [itertools.cycle([c[j][1] for c in copies]) for j in range(len(copies[0]))]
    return [(k, lambda xb, xf, t=t: next(t)(xb, xf)) for (k, _), t in zip(copies[0], turns)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--isa", default="auto", help="the quantized kernels' instruction set (auto, avx2, avx_vnni, avx512_vnni)")
    p.add_argument("--head", action="store_true", help="time the LM head instead of one layer")
    p.add_argument("--arms", default="", help="comma-separated substrings: only arms whose name has one")
    p.add_argument("--layer", default="576,192,1536",
                   help="hidden,kv,ffn of the layer (default: the default model's; K-quants need multiples of 256)")
    p.add_argument("--copies", type=int, default=1,
                   help="weight copies per arm, called in turn: enough that they outgrow the caches times the "
                        "weights streaming from memory, as a decode step reads them (default 1: cache-resident)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time, or this thread's CPU time (implies --threads 1)")
    add_quick_and_out(p, "one round of 2 calls per projection")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.reps = 1, 2
    if args.clock == "cpu":
        args.threads = 1
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    from strata.models.fused import load_quant_ops

    ops = load_quant_ops()
    if ops is not None:
        ops.set_quant_isa(args.isa)
    isa = ops.quant_isa() if ops is not None else "not built"
    shapes = {"head": HEAD} if args.head else layer_shapes(*(int(v) for v in args.layer.split(",")))
    wanted = [s for s in args.arms.split(",") if s]
    rng = np.random.default_rng(0)
    keep = lambda a: not wanted or any(s in a for s in wanted)  # noqa: E731
    copies = [arms_for(shapes, ops, rng, keep) for _ in range(args.copies)]
    arms = {a: in_turn([c[a] for c in copies]) for a in copies[0]}
    if ops is not None:  # binding a kernel loads the ops afresh, at $STRATA_QUANT_ISA's choice
        ops.set_quant_isa(args.isa)
    reps = max(2, args.reps // 10) if args.head else args.reps
    times: dict[str, dict[int, list[float]]] = {a: {r: [] for r in ROWS} for a in arms}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for rows in ROWS:
                xs = {k: torch.randn(rows, k).bfloat16() for _, k in shapes.values()}
                for name, projections in arms.items():
                    times[name][rows].append(
                        sum(timed(lambda: fn(xs[k], xs[k].float()), reps, clock) for k, fn in projections))
    med = {a: {r: statistics.median(v) for r, v in per.items()} for a, per in times.items()}
    base = med["dense bf16"]
    rows_out = [[a] + [med[a][r] for r in ROWS] + [base[r] / med[a][r] for r in (1, 8)] for a in arms]
    table = print_table(
        f"{'LM head of the default model' if args.head else f'one layer {shapes}'}, microseconds (median of {args.rounds}); "
        f"{'cache-resident weights' if args.copies == 1 else f'{args.copies} weight copies in turn'}; "
        f"{args.threads} threads, {args.clock} clock, quantized kernels: {isa}; {cpu_name()}",
        ["arm"] + [f"{r} rows us" for r in ROWS] + ["x dense bf16 @1", "x dense bf16 @8"], rows_out)
    stem = "quant_kernels_head" if args.head else f"quant_kernels-{args.layer.replace(',', '-')}"
    path = write_json(f"{stem}.json", {"args": vars(args), "isa": isa, "cpu": cpu_name(), "median_us": med,
                                       "table": table}, args.out)
    plot(med, os.path.join(args.out, f"{stem}.png"), f"{'LM head' if args.head else 'one layer'}: {isa}, {cpu_name()}")
    print(f"raw numbers: {path} (plot: {stem}.png next to it)")


def plot(med: dict[str, dict[int, float]], path: str, title: str) -> None:
    """Each arm's speed relative to dense bfloat16 at each row count (higher is faster)."""
    plt = pyplot()
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(9, 4.5))
    base = med["dense bf16"]
    for arm, per in med.items():
        ax.plot(ROWS, [base[r] / per[r] for r in ROWS], marker="o", label=arm)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ROWS, [str(r) for r in ROWS])
    ax.set_xlabel("rows in the step")
    ax.set_ylabel("speed / dense bf16")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

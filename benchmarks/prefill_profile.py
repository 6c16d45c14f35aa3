"""Where a 512-token prefill's time goes, op by op: strata against transformers, same weights.

    python benchmarks/prefill_profile.py [--prompt 512] [--rounds 3] [--threads 2] [--quick]

strata (bf16, `--weights auto`: prompts read the dense weights) reads the whole prompt in
one step (`--prefill-chunk` = the prompt); transformers (dense bf16, the same GGUF
dequantised) runs one forward over it. Where the CPU has AMX-BF16, two more strata arms run
beside it: `strata sdpa` reads the prompt's cells with SDPA instead of strata's AMX attention
(`STRATA_PROMPT_ATTENTION=sdpa`), and `strata onednn` also holds its dense weights for oneDNN's
GEMM instead of strata's AMX kernel (`STRATA_DENSE_GEMM=onednn`: the engine before either
kernel). strata's own kernels are no torch ops: their calls are listed as `strata::<name>`
(`strata::amx_linear`, `strata::prompt_attention`, the fused ops).
Each arm is profiled over `--rounds` fresh prompts under `torch.profiler` (CPU), alternating;
the table lists ms per prompt for the heaviest ops by self CPU time and the wall time; the
JSON (benchmarks/results/prefill_profile.json, or under --out) has every op. `--quick`: a 32-token prompt, one round, one pass.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, cold_prompt_ms, cpu_name, engine_with_env, print_table, write_json
from benchmarks.decode import prompt_ids

TOP = 10


def profiled(fn, rounds: int) -> tuple[float, dict[str, float]]:
    """(wall ms per call, op -> self CPU ms per call) of `fn(i)` for i in range(rounds)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for i in range(rounds):
            fn(i)
        wall = (time.perf_counter() - t) / rounds * 1e3
    return wall, {e.key: e.self_cpu_time_total / 1e3 / rounds for e in prof.key_averages()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    add_quick_and_out(p, "a 32-token prompt, 1 round, one pass")
    args = p.parse_args()
    if args.quick:
        args.prompt, args.rounds = 32, 1
    import torch
    from transformers import AutoModelForCausalLM

    from strata.config import EngineConfig
    from strata.engine.engine import Engine
    from strata.loader.default import default_model_path

    torch.set_num_threads(args.threads)
    from strata.models.packed import PackedWeight, amx_gemm

    mm = PackedWeight.mm

    def labelled(self, x, bias=None):  # strata's AMX GEMM is no torch op: give the profiler a name for it
        if self.amx is None:
            return mm(self, x, bias)
        with torch.profiler.record_function("strata::amx_linear"):
            return mm(self, x, bias)

    PackedWeight.mm = labelled

    class Labelled:  # the extension's ops, each call under a profiler label
        def __init__(self, ops):
            self.ops = ops

        def __getattr__(self, name):
            return label(f"strata::{name}", getattr(self.ops, name))

    def label(name, fn):
        def call(*a, **k):
            with torch.profiler.record_function(name):
                return fn(*a, **k)
        return call

    def make_engine(**env: str) -> Engine:
        e = engine_with_env(EngineConfig(dtype="bfloat16", weights="auto", max_context=args.prompt + 64, batch=0,
                                         prefill_chunk=args.prompt, threads=args.threads, spec="off"), **env)
        model, lanes = e._model, e._runner.lanes
        if model.ops is not None:
            model.ops = Labelled(model.ops)
        if lanes.prompt_kernel is not None:
            lanes.prompt_kernel = label("strata::prompt_attention", lanes.prompt_kernel)
        return e

    engines = {"strata": make_engine()}
    if amx_gemm() is not None:  # the same engine with SDPA, and with oneDNN's GEMMs too, side by side
        engines["strata sdpa"] = make_engine(STRATA_PROMPT_ATTENTION="sdpa")
        engines["strata onednn"] = make_engine(STRATA_PROMPT_ATTENTION="sdpa", STRATA_DENSE_GEMM="onednn")
    engine = engines["strata"]
    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.bfloat16).eval()

    def strata_arm(e: Engine):
        def run(i: int) -> None:
            cold_prompt_ms(e, prompt_ids(e.tokenizer, args.prompt, 100 + i))
        return run

    def hf_prompt(i: int) -> None:
        ids = torch.tensor([prompt_ids(engine.tokenizer, args.prompt, 200 + i)])
        with torch.inference_mode():
            hf(input_ids=ids, use_cache=True, logits_to_keep=1)

    arms = [(name, strata_arm(e)) for name, e in engines.items()] + [("transformers", hf_prompt)]
    for _, fn in arms:
        fn(99)  # warm
    res = {}
    for arm, fn in arms * (1 if args.quick else 2):
        wall, ops = profiled(fn, args.rounds)
        if arm not in res or wall < res[arm]["ms"]:
            res[arm] = {"ms": wall, "ops": ops}
    top = sorted({op for r in res.values() for op in sorted(r["ops"], key=r["ops"].get)[-TOP:]},
                 key=lambda op: -max(r["ops"].get(op, 0) for r in res.values()))
    rows = [[op] + [res[a]["ops"].get(op, 0.0) for a in res] for op in top]
    rows.append(["prompt (wall)"] + [res[a]["ms"] for a in res])
    rows.append(["prefill tok/s"] + [args.prompt * 1e3 / res[a]["ms"] for a in res])
    print_table(f"{args.prompt}-token prefill, bf16, {args.threads} threads: self CPU ms per prompt "
                f"(strata / transformers speed = {res['transformers']['ms'] / res['strata']['ms']:.2f}"
                + "".join(f", {a} {res['transformers']['ms'] / res[a]['ms']:.2f}" for a in res if a.startswith("strata "))
                + f"; {cpu_name()})",
                ["op", *res], rows)
    print(f"raw numbers: {write_json('prefill_profile.json', {'args': vars(args), 'results': res}, args.out)}")


if __name__ == "__main__":
    main()

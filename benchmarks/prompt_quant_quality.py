"""What int8 prompt GEMMs would cost in accuracy on the default model, before any kernel is built.

    python benchmarks/prompt_quant_quality.py [--threads 2] [--limit N] [--quick]

A prompt's rows read the dense bfloat16 weights (models/rows.py); an int8 GEMM with VNNI or
AMX runs about twice as fast as the bfloat16 one on the same CPU, which is the lever left for
prefill. This measures, on the prompts of `benchmarks/kv_quality.py` (chats, code), each
read whole as one prompt piece, what the usual int8 forms would do to every position's logits
against transformers on the same GGUF file (bfloat16 and float32), by computing each prompt
projection on the int8 values in float32 ("fake quantisation": the rounding an int8 kernel
would see, the sums exact):

- `bf16` (as shipped): the dense weights, bfloat16 activations;
- `w8`: weights rounded to int8 per output row (one scale a row), activations bfloat16;
- `w8a8-token`: the same weights, activations rounded to int8 per row (one scale a token:
  what `torch._int_mm` and oneDNN's dynamic int8 linear take);
- `a8-block32`: the file's weight values as they are (a Q4_1 block's codes and scales are
  exact in a blocked int8 form), activations rounded to int8 per 32 values: llama.cpp's form
  for this file's prompts (Q8_1 activations), which needs a blocked GEMM, not `_int_mm`.

The decode path's own 4-bit weights are not involved: every position is a prompt row. The LM
head stays as shipped. Per arm: top-1 agreement over every position, the mean |logit
difference| over every logit, and the largest.

Raw numbers: benchmarks/results/prompt_quant_quality.json and .png (or under --out).
`--quick`: the first two chats, against transformers in bfloat16 only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, cpu_name, print_table, pyplot, write_json
from benchmarks.kv_quality import build_prompts

ARMS = ("bf16", "w8", "w8a8-token", "a8-block32")


def fake_int8(x, dim_block: int | None):
    """x [rows, n] rounded to int8 codes and back in float32: one scale per row (`dim_block`
    None) or per `dim_block` consecutive values of a row (n a multiple of it)."""
    import torch

    xf = x.float()
    if dim_block is not None and xf.shape[1] % dim_block == 0:
        blocks = xf.view(xf.shape[0], -1, dim_block)
        scale = blocks.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / 127
        return ((blocks / scale).round().clamp(-127, 127) * scale).view_as(xf)
    scale = xf.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / 127
    return (xf / scale).round().clamp(-127, 127) * scale


class FakeQuantRows:
    """Stands in for models/linear.py's `dense_rows` (the prompt rows' GEMM) for one arm."""

    def __init__(self, arm: str):
        self.arm = arm
        self.weights: dict[int, object] = {}  # id(weight) -> its int8-rounded float32 copy

    def __call__(self, x, weight, bias, first, alone=(), out=None):
        from strata.models.packed import PackedWeight

        w = self.weights.get(id(weight))
        if w is None:
            plain = weight.plain() if isinstance(weight, PackedWeight) else weight
            w = self.weights[id(weight)] = plain.float() if self.arm == "a8-block32" else fake_int8(plain, None)
        rows = x[first:]
        a = rows.float() if self.arm == "w8" else fake_int8(rows, 32 if self.arm == "a8-block32" else None)
        y = a @ w.t()
        if bias is not None:
            y = y + bias.float()
        y = y.to(x.dtype)
        return y if out is None else out.copy_(y)


def agreement(ours, refs) -> dict:
    import torch

    positions = sum(r.shape[0] for r in refs)
    top1 = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(ours, refs))
    total = sum(float((a - b).abs().sum(dtype=torch.float64)) for a, b in zip(ours, refs))
    return {"positions": positions, "top1": top1 / positions, "mean_abs": total / sum(r.numel() for r in refs),
            "max_abs": max(float((a - b).abs().max()) for a, b in zip(ours, refs))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    add_quick_and_out(p, "the first 2 chats, against transformers in bfloat16 only")
    args = p.parse_args()
    if args.quick:
        args.limit = 2
    import torch
    import transformers

    import strata.models.linear as linear
    from strata.config import EngineConfig
    from strata.engine.engine import Engine
    from strata.loader.default import default_model_path
    from strata.testing import prompt_logits

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    path = default_model_path()
    engine = Engine(EngineConfig(model=path, dtype="bfloat16", weights="auto", max_context=2048, prefill_chunk=2048,
                                 threads=args.threads), progress=False)
    prompts = [ids for kind, ids in build_prompts(engine.tokenizer) if kind != "long"][: args.limit]
    refs_by = {}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32))[: 1 if args.quick else 2]:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=dtype).eval()
        with torch.inference_mode():
            refs_by[name] = [model(torch.tensor([ids])).logits[0].float() for ids in prompts]
        del model
    shipped = linear.dense_rows
    results = {}
    for arm in ARMS:
        linear.dense_rows = shipped if arm == "bf16" else FakeQuantRows(arm)
        try:
            ours = [prompt_logits(engine, ids) for ids in prompts]
        finally:
            linear.dense_rows = shipped
        results[arm] = {ref: agreement(ours, refs) for ref, refs in refs_by.items()}
        print(f"[{arm}] done", file=sys.stderr, flush=True)
    rows = [[arm] + [v for ref in refs_by for v in (f"{100 * results[arm][ref]['top1']:.1f} %",
                                                    f"{results[arm][ref]['mean_abs']:.3f}",
                                                    f"{results[arm][ref]['max_abs']:.2f}")] for arm in ARMS]
    columns = ["prompt GEMMs"] + [f"{h} vs transformers {ref}" for ref in refs_by
                                  for h in ("top-1", "mean |diff|", "max |diff|")]
    positions = results["bf16"]["bfloat16"]["positions"]
    text = print_table(f"Prompt rows' projections with int8 values, SmolLM2-135M-Instruct (Q4_1 file, dense copy), "
                       f"bfloat16 compute, {len(prompts)} prompts, {positions} positions, {cpu_name()}", columns, rows)
    name = "prompt_quant_quality" + ("" if args.limit is None else f"-first{args.limit}")
    out = write_json(f"{name}.json", {"args": vars(args), "cpu": cpu_name(), "results": results,
                                      "seconds": time.perf_counter() - t0, "table": text}, args.out)
    print(f"raw numbers: {out}")
    plt = pyplot()
    if plt is not None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        for ax, key, label in ((axes[0], "top1", "top-1 agreement vs transformers bf16"),
                               (axes[1], "mean_abs", "mean |logit diff| vs transformers bf16")):
            ax.bar(ARMS, [results[a]["bfloat16"][key] for a in ARMS],
                   color=["#4c72b0", "#dd8452", "#c44e52", "#8172b2"])
            ax.set_title(label, fontsize=9)
            ax.tick_params(axis="x", labelsize=8)
        fig.suptitle(f"int8 prompt GEMMs, fake-quantised ({cpu_name()})", fontsize=9)
        fig.tight_layout()
        png = os.path.join(args.out, f"{name}.png")
        fig.savefig(png, dpi=110)
        print(f"plot: {png}")


if __name__ == "__main__":
    main()

"""The int8 LM head against the dense bf16 head on the default model: top-1 agreement.

    python benchmarks/head_quality.py [--new 64] [--threads 2] [--limit N] [--quick]

`--weights auto` in bfloat16 reads the LM head as per-row int8 for decode steps of at
most 4 rows (strata/models/head.py). This measures what that costs, on the prompts of
`benchmarks/kv_quality.py` (chats, code, long contexts) and of `benchmarks/decode.py`:

- per position (teacher-forced): both heads score the same hidden state at every prompt
  position and every greedy step; the table gives top-1 agreement, whether the dense
  top-1 is in the int8 head's top 5, and the mean and max |logit difference|;
- the noise floor: the dense bf16 head's own top-1 agreement with a float32 head;
- end to end: each prompt continued greedily for `--new` tokens with the int8 head and
  with the dense head (8 lanes at a time, so steps of more than 4 rows use the dense
  weight in both arms, as in serving): the share of identical continuations.

Raw numbers: benchmarks/results/head_quality.json (or under --out). `--quick`: the first two
chats, 8 new tokens, an engine of two lanes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, print_table, write_json
from benchmarks.decode import prompt_ids
from benchmarks.kv_quality import LONG_TOKENS, build_prompts


class BothHeads:
    """Scores every row with the dense and the int8 head; returns the dense logits."""

    def __init__(self, head):
        self.head = head
        self.weight32 = head.weight.float()  # the noise floor: bf16 against float32 products
        self.stats = {"rows": 0, "top1": 0, "top5": 0, "sum_abs": 0.0, "entries": 0, "max_abs": 0.0,
                      "top1_bf16_vs_f32": 0}

    def __call__(self, x, decode_rows=None):  # every row scored both ways, whatever its kind
        import torch
        import torch.nn.functional as F

        dense = F.linear(x, self.head.weight)
        if x.shape[0] == 0:  # a step whose prompt pieces sample nothing
            return dense
        int8 = torch.cat([torch._weight_int8pack_mm(x[i : i + 4], self.head.int8.codes, self.head.int8.scale)
                          for i in range(0, x.shape[0], 4)])
        d, q = dense.float(), int8.float()
        s = self.stats
        s["rows"] += x.shape[0]
        s["top1"] += int((d.argmax(-1) == q.argmax(-1)).sum())
        s["top5"] += int((q.topk(5, dim=-1).indices == d.argmax(-1, keepdim=True)).any(-1).sum())
        diff = (d - q).abs()
        s["sum_abs"] += float(diff.sum(dtype=torch.float64))
        s["entries"] += diff.numel()
        s["max_abs"] = max(s["max_abs"], float(diff.max()))
        s["top1_bf16_vs_f32"] += int((d.argmax(-1) == F.linear(x.float(), self.weight32).argmax(-1)).sum())
        return dense


def continuations(engine, prompts, new: int) -> list[list[int]]:
    from strata.sampling import SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    outs: dict[int, list[int]] = {}
    for start in range(0, len(prompts), 8):
        engine._scheduler.clear_cache()
        req = {engine.submit(ids, greedy): k for k, (_, ids) in enumerate(prompts[start : start + 8], start)}
        for o in engine.run_until_done():
            outs.setdefault(req[o.request_id], []).extend(o.new_token_ids)
    return [outs[k] for k in range(len(prompts))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--new", type=int, default=64, help="greedy tokens per continuation")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--limit", type=int, default=None, help="only the first N prompts (a quick look)")
    add_quick_and_out(p, "the first 2 prompts (chats), 8 new tokens, 2 lanes")
    args = p.parse_args()
    if args.quick:
        args.limit, args.new = 2, 8
    import torch

    from strata.config import EngineConfig
    from strata.engine.engine import Engine
    from strata.models.head import Int8Head
    from strata.testing import prompt_logits

    torch.set_num_threads(args.threads)
    os.environ["STRATA_HEAD_KERNEL"] = "int8"  # the int8 copy is what this measures (models/head.py)
    engine = Engine(EngineConfig(dtype="bfloat16", weights="auto", max_context=512 if args.quick else LONG_TOKENS + 256,
                                 batch=1 if args.quick else 7, threads=args.threads), progress=False)
    model = engine._model
    head = model.lm_head
    assert isinstance(head, Int8Head), type(head)
    tok = engine.tokenizer
    prompts = build_prompts(tok) + [("decode", prompt_ids(tok, 512, v)) for v in range(8)]
    prompts = prompts[: args.limit]
    t0 = time.perf_counter()
    both = BothHeads(head)
    model.lm_head = both
    for i, (_, ids) in enumerate(prompts):  # every prompt position
        prompt_logits(engine, ids)
        print(f"[{i + 1}/{len(prompts)}] positions", file=sys.stderr, flush=True)
    continuations(engine, prompts, args.new)  # every greedy step on the dense path
    per_position = dict(both.stats)
    model.lm_head = head
    with_int8 = continuations(engine, prompts, args.new)
    head.max_rows = 0  # the same engine, dense at every step
    with_dense = continuations(engine, prompts, args.new)
    head.max_rows = 4
    same = [a == b for a, b in zip(with_int8, with_dense)]
    s = per_position
    text = print_table(
        f"int8 LM head against the dense bf16 head, SmolLM2-135M-Instruct, bfloat16 compute "
        f"({len(prompts)} prompts, {s['rows']} scored positions; continuations of {args.new} tokens)",
        ["positions", "top-1 agreement", "dense top-1 in int8 top-5", "mean |logit diff|", "max |logit diff|",
         f"identical {args.new}-token continuations", "dense bf16 vs float32 head: top-1"],
        [[s["rows"], f"{100 * s['top1'] / s['rows']:.2f} %", f"{100 * s['top5'] / s['rows']:.2f} %",
          f"{s['sum_abs'] / s['entries']:.4f}", f"{s['max_abs']:.3f}", f"{100 * sum(same) / len(same):.0f} %",
          f"{100 * s['top1_bf16_vs_f32'] / s['rows']:.2f} %"]],
    )
    name = "head_quality.json" if args.limit is None else f"head_quality-first{args.limit}.json"
    path = write_json(name, {"args": vars(args), "per_position": s, "identical": same,
                             "seconds": time.perf_counter() - t0, "table": text}, args.out)
    print(f"raw numbers: {path}")


if __name__ == "__main__":
    main()

"""int8 K/V against bf16 K/V on the default model: logits and greedy continuations.

    python benchmarks/kv_quality.py [--new 64] [--threads 2] [--ref bf16] [--test int8] [--dtype bfloat16]

Prompts (built here, 50+): chats through the model's chat template (one and several
turns), code snippets (raw and inside a chat), and long contexts of ~3.9K tokens made by
concatenating varied text. Both K/V arms hold the same weights (bfloat16 compute, what
users run) in one process. Per prompt, `strata.testing.prompt_logits` gives every position's logits
under each arm: the table reports the mean and max |logit difference| over every position
and vocabulary entry, and top-1 agreement per position; then each prompt is continued
greedily for `--new` tokens (ignore EOS) under each arm, and the share of continuations
that are identical token for token. Raw numbers: benchmarks/results/kv_quality.json
(other arms or --limit: kv_quality-TEST-vs-REF[-firstN].json). In bfloat16 compute f16 and
f32 K/V store the bf16 values exactly (`--test f32`: no difference at all), so int8 is the
only K/V dtype whose logits differ.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, print_table, progress_bar, write_json

CHATS = [
    "Write a haiku about tides.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Explain photosynthesis to a ten-year-old.",
    "Give me three tips for a job interview.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "What's the difference between a virus and a bacterium?",
    "Suggest a name for a bakery that sells only croissants.",
    "How many minutes are there in a week? Show your work.",
    "Write a limerick about a cat who learned to code.",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "Why is the sky blue?",
    "List five fruits that are high in vitamin C.",
    "What should I pack for a weekend hiking trip in the mountains?",
    "Explain what a black hole is.",
    "Is it better to rent or to buy a house? Give pros and cons.",
    "Write a short thank-you note to a colleague who helped me move.",
    "What are the primary colours?",
    "How do I make a cup of green tea properly?",
    "Tell me a fun fact about octopuses.",
    "What is 17 times 23?",
]
MULTI_TURN = [
    [("Hi! Can you help me plan a dinner party?", "Of course! How many guests are you expecting, and do any "
      "of them have dietary restrictions?"), ("Eight people, two are vegetarian.", None)],
    [("What is Python?", "Python is a high-level programming language known for its readable syntax."),
     ("Is it good for beginners?", None)],
    [("I feel tired every afternoon.", "That is common. Do you eat a large lunch or sleep poorly?"),
     ("I sleep about six hours.", None)],
    [("Recommend a book.", "Try 'The Hobbit' by J.R.R. Tolkien, an adventure classic."),
     ("Something shorter, please.", None)],
    [("Name a planet.", "Mars."), ("Another one?", "Jupiter."), ("And the biggest?", None)],
]
CODE = [
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\nprint(fib(10))\n",
    "#include <stdio.h>\n\nint main(void) {\n    int sum = 0;\n    for (int i = 1; i <= 100; i++) sum += i;\n"
    "    printf(\"%d\\n\", sum);\n    return 0;\n}\n",
    "SELECT customer_id, COUNT(*) AS orders\nFROM orders\nWHERE created_at >= '2024-01-01'\n"
    "GROUP BY customer_id\nHAVING COUNT(*) > 5\nORDER BY orders DESC;\n",
    "function debounce(fn, ms) {\n  let t;\n  return (...args) => {\n    clearTimeout(t);\n"
    "    t = setTimeout(() => fn(...args), ms);\n  };\n}\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"
    "        self.items.append(x)\n\n    def pop(self):\n        return self.items.pop()\n",
    "fn main() {\n    let v: Vec<i32> = (1..=10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "import numpy as np\n\nx = np.linspace(0, 1, 100)\ny = np.sin(2 * np.pi * x)\nprint(y.mean(), y.std())\n",
    "#!/bin/sh\nfor f in *.log; do\n  gzip \"$f\"\ndone\necho done\n",
    "public class Hello {\n    public static void main(String[] args) {\n"
    "        System.out.println(\"Hello, world\");\n    }\n}\n",
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    p, *rest = xs\n"
    "    return quicksort([x for x in rest if x < p]) + [p] + quicksort([x for x in rest if x >= p])\n",
]
CODE_QUESTIONS = ["Explain what this code does:", "Find a bug or an improvement in this code:",
                  "Rewrite this code with comments:"]
PROSE = [
    "The river ran brown after the storm, carrying branches and leaves past the old mill. ",
    "In 1869 the transcontinental railroad joined the east and west coasts of the United States. ",
    "Mitochondria produce most of the chemical energy needed to power a cell's reactions. ",
    "The committee met on Tuesday to discuss the budget for the next fiscal year. ",
    "She opened the letter slowly, already knowing what it would say. ",
    "A hash table maps keys to values by computing an index into an array of buckets. ",
    "Volcanic soils are often very fertile because they are rich in minerals. ",
    "The orchestra tuned to the oboe's A before the conductor walked on stage. ",
    "Interest rates rose for the third time this year, slowing the housing market. ",
    "Penguins huddle together to conserve heat during the Antarctic winter. ",
]
LONG_TOKENS = 3900
LONG_QUESTIONS = ["Summarise the text above in three sentences.", "What are the main topics of the text above?",
                  "Which sentence above mentions a railroad?", "List three facts from the text above.",
                  "What happened after the storm, according to the text?", "Write a title for the text above."]


def build_prompts(tok) -> list[tuple[str, list[int]]]:
    """(kind, token ids): chats, multi-turn chats, code (raw and in a chat), long contexts."""
    def chat(turns):
        msgs = []
        for user, assistant in turns:
            msgs.append({"role": "user", "content": user})
            if assistant is not None:
                msgs.append({"role": "assistant", "content": assistant})
        return tok.encode_chat(msgs)

    prompts = [("chat", chat([(q, None)])) for q in CHATS]
    prompts += [("chat", chat(t)) for t in MULTI_TURN]
    prompts += [("code", tok.encode(c)) for c in CODE]
    prompts += [("code", chat([(f"{CODE_QUESTIONS[i % 3]}\n\n```\n{c}```", None)])) for i, c in enumerate(CODE)]
    for i, question in enumerate(LONG_QUESTIONS):
        parts, n, j = [], 0, i
        while n < LONG_TOKENS - 150:  # varied text: prose, code and questions in a rotating order
            piece = [PROSE[j % len(PROSE)], CODE[j % len(CODE)], CHATS[j % len(CHATS)] + " "][j % 3]
            parts.append(piece)
            n += len(tok.encode(piece, add_special_tokens=False))
            j += 7
        ids = chat([("".join(parts) + "\n\n" + question, None)])
        prompts.append(("long", ids))
    return prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref", default="bf16", help="the reference K/V dtype")
    p.add_argument("--test", default="int8", help="the K/V dtype measured against it")
    p.add_argument("--dtype", default="bfloat16", help="compute dtype (bfloat16: what users run)")
    p.add_argument("--new", type=int, default=64, help="greedy tokens per continuation")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--limit", type=int, default=None, help="only the first N prompts (a quick look)")
    add_quick_and_out(p, "the first 2 prompts (chats), 8 new tokens, engines of two lanes")
    args = p.parse_args()
    if args.quick:
        args.limit, args.new = 2, 8
    import torch

    from strata.config import EngineConfig
    from strata.engine.engine import Engine
    from strata.sampling import SamplingParams
    from strata.testing import prompt_logits

    torch.set_num_threads(args.threads)
    arms = (args.ref, args.test)
    engines = {kv: Engine(EngineConfig(dtype=args.dtype, kv=kv, max_context=512 if args.quick else LONG_TOKENS + 256,
                                       batch=1 if args.quick else 7, threads=args.threads), progress=False)
               for kv in arms}
    prompts = build_prompts(engines[args.ref].tokenizer)[: args.limit]
    t0 = time.perf_counter()
    rows = []
    bar = progress_bar(len(prompts) * (1 + len(arms)), "logits, then continuations", unit="prompt")
    for i, (kind, ids) in enumerate(prompts):
        a, b = (prompt_logits(engines[kv], ids) for kv in arms)
        diff = (a - b).abs()
        rows.append({"kind": kind, "tokens": len(ids), "sum_abs": diff.sum(dtype=torch.float64).item(),
                     "entries": diff.numel(), "max_abs": diff.max().item(),
                     "top1_agree": (a.argmax(-1) == b.argmax(-1)).sum().item()})
        bar.write(f"[{i + 1}/{len(prompts)}] {kind} {len(ids)} tokens: max |diff| {rows[-1]['max_abs']:.3f}, "
                  f"top-1 {rows[-1]['top1_agree']}/{len(ids)}", file=sys.stderr)
        bar.update(1)
        del a, b, diff
    greedy = SamplingParams(temperature=0, max_tokens=args.new, ignore_eos=True)
    conts = {}
    for kv, e in engines.items():
        e._scheduler.clear_cache()
        outs = {}
        for start in range(0, len(prompts), 8):  # 8 lanes decode together
            req = {e.submit(ids, greedy): k for k, (_, ids) in enumerate(prompts[start : start + 8], start)}
            for o in e.run_until_done():
                outs.setdefault(req[o.request_id], []).extend(o.new_token_ids)
            e._scheduler.clear_cache()
            bar.update(len(req))
        conts[kv] = [outs[k] for k in range(len(prompts))]
    bar.close()
    for k, row in enumerate(rows):
        a, b = conts[args.ref][k], conts[args.test][k]
        row["identical"] = a == b
        row["first_divergence"] = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)

    def summary(sel):
        return {"prompts": len(sel), "positions": sum(r["tokens"] for r in sel),
                "mean_abs": sum(r["sum_abs"] for r in sel) / sum(r["entries"] for r in sel),
                "max_abs": max(r["max_abs"] for r in sel),
                "top1": sum(r["top1_agree"] for r in sel) / sum(r["tokens"] for r in sel),
                "identical": sum(r["identical"] for r in sel) / len(sel)}

    kinds = ["chat", "code", "long"]
    table = {k: summary([r for r in rows if r["kind"] == k]) for k in kinds if any(r["kind"] == k for r in rows)}
    table["all"] = summary(rows)
    text = print_table(
        f"{args.test} K/V against {args.ref} K/V, SmolLM2-135M-Instruct, {args.dtype} compute "
        f"({len(prompts)} prompts; greedy continuations of {args.new} tokens)",
        ["prompts", "n", "positions", "mean |logit diff|", "max |logit diff|", "top-1 agreement",
         f"identical {args.new}-token continuations"],
        [[k, v["prompts"], v["positions"], f"{v['mean_abs']:.4f}", f"{v['max_abs']:.3f}", f"{100 * v['top1']:.2f} %",
          f"{100 * v['identical']:.0f} %"] for k, v in table.items()],
    )
    bpc = {kv: e._kv.bytes_per_cell for kv, e in engines.items()}
    name = "kv_quality.json" if arms == ("bf16", "int8") and args.limit is None else (
        f"kv_quality-{args.test}-vs-{args.ref}{'' if args.limit is None else f'-first{args.limit}'}.json")
    path = write_json(name, {"args": vars(args), "bytes_per_cell": bpc, "summary": table,
                             "prompts": rows, "seconds": time.perf_counter() - t0, "table": text}, args.out)
    print(f"bytes per cell: {bpc}\nraw numbers: {path}")


if __name__ == "__main__":
    main()

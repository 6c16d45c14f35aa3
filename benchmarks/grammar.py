"""Structured outputs' cost (issue 24): decode tok/s with a JSON schema against without, at
1 and 8 lanes, on the default model; the schema's compile time; and the grammar libraries'
compile time and per-token mask cost on the model's 49k vocabulary (grammar_parts/libraries.py).

Arms: one engine (bf16, --batch 7, --spec off), the same chat prompt per lane, `--new` tokens
per request. "json" holds every lane to a schema whose answer is longer than `--new` (an array
of at least 64 short strings), so the grammar is live for every token; "plain" decodes freely
with ignore_eos. Decode tok/s = tokens of the steps after every lane has its first token /
their wall time. Arms alternate within each round (order rotating); the ratio is the median
of per-round paired ratios. Absolute tok/s on a shared machine are noise; ratios count.

    python benchmarks/grammar.py [--rounds 3] [--new 32] [--lanes 1,8] [--libs-path DIR] [--quick]

Writes benchmarks/results/grammar.json and grammar.png (or under --out). `--quick`: 1 round of
8 tokens at 1 and 2 lanes, one compile trial per library.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, cpu_name, print_table, pyplot, write_json  # noqa: E402
from benchmarks.grammar_parts.libraries import measure_all  # noqa: E402
from strata.config import EngineConfig  # noqa: E402

LONG_SCHEMA = {"type": "object", "properties": {"words": {"type": "array", "minItems": 64,
                                                          "items": {"type": "string", "maxLength": 12}}},
               "required": ["words"], "additionalProperties": False}
PROMPT = [{"role": "user", "content": "List many English words as JSON."}]


def decode_run(engine, prompt, params, lanes: int) -> float:
    """Decode tok/s of `lanes` requests of `prompt` (steps after every lane's first token)."""
    ids = [engine.submit(prompt, params) for _ in range(lanes)]
    seen: set[str] = set()
    tokens, t0 = 0, None
    while engine.has_work:
        outs = engine.step()
        if t0 is not None:
            tokens += sum(len(o.new_token_ids) for o in outs)
        seen |= {o.request_id for o in outs if o.new_token_ids}
        if t0 is None and seen >= set(ids):
            t0 = time.perf_counter()
    return tokens / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--lanes", default="1,8")
    ap.add_argument("--trials", type=int, default=5, help="compile trials per library")
    ap.add_argument("--libs-path", default=None, help="a directory with xgrammar / outlines_core to compare")
    add_quick_and_out(ap, "1 round of 8 tokens at 1 and 2 lanes, one compile trial per library")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.new, a.lanes, a.trials = 1, 8, "1,2", 1
    if a.libs_path:
        sys.path.insert(0, a.libs_path)
    from strata.engine.interface import Engine
    from strata.sampling import SamplingParams
    from strata.server.params import ModelInfo

    engine = Engine(EngineConfig(batch=7, max_context=1024, spec="off"), progress=False)
    info = ModelInfo("bench", engine.info.tokenizer, 1024, engine.info.vocab_size, engine.info.fingerprint)
    tok = info.tokenizer
    libraries = measure_all(tok, engine.info.vocab_size, tok.eos_token_ids[0], a.trials)
    t0 = time.perf_counter()
    info.grammars.tokenizer()  # the tokenizer's tables: built once per model, on first use
    tokenizer_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    grammar = info.grammars.json_schema({**LONG_SCHEMA, "title": "bench"}, "bench")
    first = grammar.matcher()  # the first matcher and mask: what a request's first token waits for
    import torch
    first.fill_masks(torch.zeros(1, engine.info.vocab_size))
    compile_ms = (time.perf_counter() - t0) * 1e3
    prompt = tok.encode_chat(PROMPT)
    arms = {"plain": SamplingParams(max_tokens=a.new, temperature=0, ignore_eos=True),
            "json": SamplingParams(max_tokens=a.new, temperature=0, grammar=grammar)}
    lanes_list = [int(x) for x in a.lanes.split(",")]
    runs: dict[str, list[float]] = {f"{arm}@{n}": [] for n in lanes_list for arm in arms}
    for r in range(a.rounds):
        for n in lanes_list:
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for arm in order:
                runs[f"{arm}@{n}"].append(decode_run(engine, prompt, arms[arm], n))
    rows = []
    for n in lanes_list:
        plain, held = runs[f"plain@{n}"], runs[f"json@{n}"]
        ratios = [j / p for j, p in zip(held, plain)]
        rows.append({"lanes": n, "plain_tok_s": statistics.median(plain), "json_tok_s": statistics.median(held),
                     "ratio": statistics.median(ratios), "rounds": a.rounds})
    result = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "loadavg_1m": os.getloadavg()[0],
              "new_tokens": a.new, "tokenizer_setup_ms": tokenizer_ms, "schema_compile_ms": compile_ms, "decode": rows, "libraries": libraries,
              "runs": runs}
    print(f"CPU: {result['cpu']} ({result['threads']} threads, load {result['loadavg_1m']:.1f})")
    print(f"tokenizer tables (once per model): {tokenizer_ms:.0f} ms; "
          f"schema compile (first matcher and mask): {compile_ms:.1f} ms")
    print_table(f"decode, {a.new} new tokens per lane (median of {a.rounds} rounds)",
                ["lanes", "free tok/s", "JSON schema tok/s", "schema/free"],
                [[r["lanes"], r["plain_tok_s"], r["json_tok_s"], f"{r['ratio']:.3f}"] for r in rows])
    print_table("grammar libraries (this model's vocabulary)",
                ["library", "tokenizer ms", "compile ms", "mask us p50", "mask us p99"],
                [[lib["library"], "not installed", lib["missing"], "", ""] if "missing" in lib else
                 [lib["library"], lib["tokenizer_setup_ms"], lib["compile_ms"], lib["mask_us_median"],
                  lib["mask_us_p99"]] for lib in libraries])
    write_json("grammar.json", result, a.out)
    plot(result, os.path.join(a.out, "grammar.png"))
    return 0


def plot(result: dict, path: str) -> None:
    plt = pyplot()
    if plt is None:
        return

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    rows = result["decode"]
    xs = range(len(rows))
    left.bar([x - 0.2 for x in xs], [r["plain_tok_s"] for r in rows], 0.4, label="free")
    left.bar([x + 0.2 for x in xs], [r["json_tok_s"] for r in rows], 0.4, label="JSON schema")
    left.set_xticks(list(xs), [f"{r['lanes']} lane(s)\n{r['ratio']:.2f}x" for r in rows])
    left.set_ylabel("decode tok/s")
    left.legend()
    libs = [lib for lib in result["libraries"] if "missing" not in lib]
    right.bar([lib["library"] for lib in libs], [lib["mask_us_median"] for lib in libs])
    right.set_ylabel("mask per token, median (us)")
    fig.suptitle(f"grammar cost on {result['cpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())

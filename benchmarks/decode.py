"""Prefill and decode speed on the default model: strata vs transformers (vs llama.cpp).

Each arm runs in its own interpreter (so load time and peak RSS are its own), arms are
interleaved over several rounds, and the table reports medians and each strata row's
ratio to each peer. Same file (the SmolLM2-135M-Instruct Q4_1 GGUF), same dtype (bf16
compute), same thread count, a 512-token prompt.

Strata runs three ways, so that each comparison is like for like: `--weights auto` (its
default: decode steps read the GGUF's 4-bit blocks, prompt pieces a dense copy),
`--weights dense` (dequantised bf16 weights, as transformers holds them), and `--weights
auto` with `--kv-pool-tokens` (the shared pool, sized as the 8 lanes' reservations, in
place of the reserved layout; the "pool / reserved" row shows what the pool costs at
short contexts). transformers runs dense bf16; llama.cpp reads the 4-bit file.

    python benchmarks/decode.py [--rounds 3] [--new 128] [--threads 2] [--strata auto,dense,pool] [--quick]

`--quick` runs strata's 4-bit arm alone (no peer: transformers and llama.cpp are measured in
full runs only, and the output says so) on a 32-token prompt, 4 new tokens, one round.

llama.cpp runs when `llama_cpp` (llama-cpp-python, the optional `llamacpp` extra) is
importable: its high-level API for prefill and one lane, its low-level batch API (one
llama_decode per step for all 8 sequences) for the 8-lane column.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, interleaved, medians, peak_rss_mib, print_table, run_arm, write_json
from benchmarks.decode_parts.plot import plot

PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs each evening, counting the steps as his father "
    "had taught him, and watched the ships pass beyond the reef while the gulls settled on the rocks. "
)
LANES = 8
KV_CHUNK = 128  # each lane reserves about what it uses, as transformers' static cache does
STRATA_ARMS = {"auto": "strata", "dense": "strata-dense", "pool": "strata-pool"}  # --strata value -> arm
LABELS = {"strata": "strata 4-bit (--weights auto)", "strata-dense": "strata dense (--weights dense)",
          "strata-pool": "strata 4-bit, pool (--kv-pool-tokens)", "transformers": "transformers dense bf16",
          "llama.cpp": "llama.cpp Q4_1"}


def prompt_ids(tokenizer, n: int, variant: int) -> list[int]:
    ids = tokenizer.encode(f"Story {variant}. " + PARAGRAPH * 40)
    return ids[:n]


def speeds(args, load_s: float, prefill_s: float, dec1_s: float, dec8_s: float) -> dict:
    """One arm's row: seconds in, rates out."""
    return {
        "load_s": load_s,
        "prefill_tok_s": args.prompt / prefill_s,
        "decode_tok_s": args.new / dec1_s,
        "decode8_tok_s": LANES * args.new / dec8_s,
        "peak_rss_mib": peak_rss_mib(),
    }


def arm_strata(args) -> dict:
    import torch

    from strata.config import EngineConfig
    from strata.engine.engine import Engine
    from strata.sampling import SamplingParams

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    engine = Engine(EngineConfig(dtype="bfloat16", weights=args.weights, max_context=max_context(args),
                                 batch=LANES - 1, kv_chunk=KV_CHUNK, kv_pool_tokens=args.kv_pool_tokens,
                                 prefill_chunk=args.prompt, threads=args.threads,
                                 spec="off"),  # one token a step, as the peers decode (drafts: spec.py)
                    progress=False)
    load_s = time.perf_counter() - t0
    tok = engine.tokenizer

    def run(prompts, max_tokens):
        """Seconds to the last lane's first token, and from there to the end."""
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        engine._scheduler.clear_cache()
        ids = {engine.submit(p, params) for p in prompts}
        started = set()
        t = time.perf_counter()
        t_first = None
        while engine.has_work:
            for out in engine.step():
                if out.new_token_ids:
                    started.add(out.request_id)
            if t_first is None and started == ids:
                t_first = time.perf_counter()
        return t_first - t, time.perf_counter() - t_first

    run([prompt_ids(tok, min(64, args.prompt), 99)], 4)  # warm-up
    prefill_s = min(run([prompt_ids(tok, args.prompt, v)], 1)[0] for v in range(3))
    _, dec1 = run([prompt_ids(tok, args.prompt, 10)], args.new + 1)
    _, dec8 = run([prompt_ids(tok, args.prompt, 20 + i) for i in range(LANES)], args.new + 1)
    return speeds(args, load_s, prefill_s, dec1, dec8)


def max_context(args) -> int:
    return args.prompt + args.new + 8


def arm_strata_dense(args) -> dict:
    """The strata arm with dequantised weights (`--weights dense`)."""
    return arm_strata(argparse.Namespace(**{**vars(args), "weights": "dense"}))


def arm_strata_pool(args) -> dict:
    """The strata arm in the shared pool, holding exactly the K/V the reserved layout
    reserves (LANES lanes of --max-context in whole chunks): only the layout differs."""
    pool_tokens = LANES * -(-max_context(args) // KV_CHUNK) * KV_CHUNK
    return arm_strata(argparse.Namespace(**{**vars(args), "kv_pool_tokens": pool_tokens}))


def arm_transformers(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from strata.loader import open_model
    from strata.loader.default import default_model_path

    torch.set_num_threads(args.threads)
    path = default_model_path()
    tok = open_model(path).tokenizer
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.bfloat16
    ).eval()
    load_s = time.perf_counter() - t0
    # The "dense bf16" label: transformers unpacks this architecture's GGUF blocks on load (its
    # packed GGUF path, which warns about float32 kernels, covers other architectures only).
    packed = [n for n, w in model.named_parameters() if w.dtype != torch.bfloat16]
    if packed:
        raise RuntimeError(f"transformers kept weights that are not dense bf16: {packed[:3]}")

    def gen(batch: list[list[int]], new: int) -> float:
        x = torch.tensor(batch)
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, cache_implementation="static", pad_token_id=2)
        return time.perf_counter() - t

    gen([prompt_ids(tok, min(64, args.prompt), 99)], 4)  # warm-up
    prefill_s = min(gen([prompt_ids(tok, args.prompt, v)], 1) for v in range(3))
    one = [prompt_ids(tok, args.prompt, 10)]
    dec1 = gen(one, args.new + 1) - gen(one, 1)
    eight = [prompt_ids(tok, args.prompt, 20 + i) for i in range(LANES)]
    dec8 = gen(eight, args.new + 1) - gen(eight, 1)
    return speeds(args, load_s, prefill_s, dec1, dec8)


def arm_llamacpp(args) -> dict:
    from llama_cpp import Llama

    from strata.loader import open_model
    from strata.loader.default import default_model_path

    path = default_model_path()
    tok = open_model(path).tokenizer
    t0 = time.perf_counter()
    llm = Llama(model_path=path, n_ctx=args.prompt + args.new + 8, n_threads=args.threads,
                n_threads_batch=args.threads, n_batch=args.prompt, verbose=False)
    load_s = time.perf_counter() - t0

    def prefill(ids) -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        return time.perf_counter() - t

    prefill(prompt_ids(tok, 64, 99))
    prefill_s = min(prefill(prompt_ids(tok, args.prompt, v)) for v in range(3))
    import numpy as np

    def last_logits():  # the last evaluated token's logits (llama-cpp-python keeps no copy)
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    prefill(prompt_ids(tok, args.prompt, 10))
    token = int(np.argmax(last_logits()))
    t = time.perf_counter()
    for _ in range(args.new):  # greedy, one token per eval: llama.cpp's own decode step
        llm.eval([token])
        token = int(np.argmax(last_logits()))
    dec1 = time.perf_counter() - t
    llm.close()  # its context and K/V go before the 8-lane context is made
    return speeds(args, load_s, prefill_s, dec1, llamacpp_decode_lanes(args, path, tok))


def llamacpp_decode_lanes(args, path: str, tok) -> float:
    """Seconds for `args.new` greedy steps of LANES sequences decoded together: one
    llama_decode per step over a batch of one token per sequence (llama.cpp's own
    continuous batching, as llama-server and batched-bench drive it)."""
    import llama_cpp
    import numpy as np
    from llama_cpp import _internals

    mparams = llama_cpp.llama_model_default_params()
    model = _internals.LlamaModel(path_model=path, params=mparams, verbose=False)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = LANES * -(-(args.prompt + args.new + 8) // 256) * 256  # its cache comes in 256-cell steps
    cparams.n_batch = cparams.n_ubatch = args.prompt
    cparams.n_seq_max = LANES
    cparams.n_threads = cparams.n_threads_batch = args.threads
    ctx = _internals.LlamaContext(model=model, params=cparams, verbose=False)
    batch = _internals.LlamaBatch(n_tokens=max(args.prompt, LANES), embd=0, n_seq_max=LANES, verbose=False)
    n_vocab = model.n_vocab()

    def argmax(i: int) -> int:
        return int(np.argmax(np.ctypeslib.as_array(ctx.get_logits_ith(i), shape=(n_vocab,))))

    tokens = []
    for s in range(LANES):  # each lane's prompt, then its first token
        batch.reset()
        batch.add_sequence(prompt_ids(tok, args.prompt, 20 + s), s, False)
        ctx.decode(batch)
        tokens.append(argmax(args.prompt - 1))
    b = batch.batch
    t = time.perf_counter()
    for step in range(args.new):
        b.n_tokens = LANES
        for s in range(LANES):
            b.token[s], b.pos[s], b.n_seq_id[s], b.logits[s] = tokens[s], args.prompt + step, 1, True
            b.seq_id[s][0] = s
        ctx.decode(batch)
        tokens = [argmax(s) for s in range(LANES)]
    return time.perf_counter() - t


ARMS = {"strata": arm_strata, "strata-dense": arm_strata_dense, "strata-pool": arm_strata_pool,
        "transformers": arm_transformers, "llama.cpp": arm_llamacpp}
METRICS = ["prefill_tok_s", "decode_tok_s", "decode8_tok_s", "load_s", "peak_rss_mib"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", choices=sorted(ARMS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--strata", default="auto,dense,pool",
                   help="strata rows: auto (--weights auto), dense (--weights dense), pool (--kv-pool-tokens)")
    add_quick_and_out(p, "strata's 4-bit arm only (no peers), 32-token prompt, 4 new tokens, 1 round")
    p.set_defaults(weights="auto", kv_pool_tokens=None)  # the strata arm's; its variants replace them
    args = p.parse_args()
    if args.arm:
        print(json.dumps(ARMS[args.arm](args)))
        return
    if args.quick:
        args.prompt, args.new, args.rounds, args.strata = 32, 4, 1, "auto"
    chosen = [x.strip() for x in args.strata.split(",") if x.strip()]
    if not chosen or set(chosen) - set(STRATA_ARMS):
        p.error(f"--strata: choose from {', '.join(STRATA_ARMS)} (got {args.strata!r})")
    strata_arms = [STRATA_ARMS[x] for x in STRATA_ARMS if x in chosen]
    arms = list(strata_arms)
    if args.quick:
        print("--quick: strata's arm only; the peers (transformers, llama.cpp) were not run")
    else:
        arms.append("transformers")
        try:
            import llama_cpp  # noqa: F401

            arms.append("llama.cpp")
        except ImportError:
            print("llama.cpp: llama-cpp-python is not installed; its arm is left out", file=sys.stderr)
    passthrough = ["--prompt", str(args.prompt), "--new", str(args.new), "--threads", str(args.threads)]
    raw = interleaved(arms, args.rounds, lambda arm: run_arm(__file__, arm, passthrough))
    med = {arm: medians(rows) for arm, rows in raw.items()}
    rows = [[LABELS[arm]] + [med[arm][m] for m in METRICS] for arm in arms]
    peers = [a for a in arms if a not in strata_arms]
    for arm in strata_arms:
        for peer in peers:
            rows.append([f"{LABELS[arm]} / {peer}"] + [med[arm][m] / med[peer][m] for m in METRICS])
    if {"strata", "strata-pool"} <= set(arms):
        rows.append(["pool / reserved (strata 4-bit)"] + [med["strata-pool"][m] / med["strata"][m] for m in METRICS])
    table = print_table(
        f"decode benchmark: {args.prompt}-token prompt, {args.new} new tokens, {args.threads} threads, "
        f"bf16 compute, median of {args.rounds} interleaved rounds; strata's pool row holds the same K/V "
        f"as its {LANES} reserved lanes ({KV_CHUNK}-cell chunks)",
        ["arm", "prefill tok/s", "decode tok/s (1 lane)", f"decode tok/s ({LANES} lanes)", "load s", "peak RSS MiB"],
        rows,
    )
    path = write_json("decode.json", {"args": vars(args), "raw": raw, "median": med, "table": table}, args.out)
    plot(med, LABELS, os.path.splitext(path)[0] + ".png")
    print(f"raw numbers: {path} (plot: decode.png next to it)")


if __name__ == "__main__":
    main()

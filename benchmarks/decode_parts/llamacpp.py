"""decode.py's llama.cpp arm: llama-cpp-python on the same GGUF file and the same token ids.

It imports neither strata nor torch, so its RSS is llama.cpp's own (plus the interpreter and
numpy). Prefill and one lane through the high-level API (one eval per token, greedy on the
last logits); eight lanes through the low-level batch API: one llama_decode per step for all
sequences, llama.cpp's own continuous batching as llama-server and batched-bench drive it.
"""

from __future__ import annotations

import time


def run(args, prompts: dict, lanes: int) -> dict:
    """`prompts`: decode.py's token ids ("warmup", "prefill" [3], "one", "eight" [lanes])."""
    import numpy as np
    from llama_cpp import Llama

    from benchmarks.common import rss_mib

    base_rss = rss_mib()
    t0 = time.perf_counter()
    llm = Llama(model_path=args.model, n_ctx=args.prompt + args.new + 8, n_threads=args.threads,
                n_threads_batch=args.threads, n_batch=args.prompt, verbose=False)
    load_s = time.perf_counter() - t0

    def prefill(ids) -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        return time.perf_counter() - t

    def last_logits():  # the last evaluated token's logits (llama-cpp-python keeps no copy)
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    prefill(prompts["warmup"])
    prefill_s = min(prefill(ids) for ids in prompts["prefill"])
    prefill(prompts["one"])
    token = int(np.argmax(last_logits()))
    t = time.perf_counter()
    for _ in range(args.new):  # greedy, one token per eval: llama.cpp's own decode step
        llm.eval([token])
        token = int(np.argmax(last_logits()))
    dec1 = time.perf_counter() - t
    llm.close()  # its context and K/V go before the 8-lane context is made
    return {"load_s": load_s, "prefill_s": prefill_s, "dec1_s": dec1,
            "dec8_s": decode_lanes(args, prompts["eight"], lanes), "base_rss_mib": base_rss}


def decode_lanes(args, prompts: list[list[int]], lanes: int) -> float:
    """Seconds for `args.new` greedy steps of `lanes` sequences decoded together."""
    import llama_cpp
    import numpy as np
    from llama_cpp import _internals

    mparams = llama_cpp.llama_model_default_params()
    model = _internals.LlamaModel(path_model=args.model, params=mparams, verbose=False)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = lanes * -(-(args.prompt + args.new + 8) // 256) * 256  # its cache comes in 256-cell steps
    cparams.n_batch = cparams.n_ubatch = args.prompt
    cparams.n_seq_max = lanes
    cparams.n_threads = cparams.n_threads_batch = args.threads
    ctx = _internals.LlamaContext(model=model, params=cparams, verbose=False)
    batch = _internals.LlamaBatch(n_tokens=max(args.prompt, lanes), embd=0, n_seq_max=lanes, verbose=False)
    n_vocab = model.n_vocab()

    def argmax(i: int) -> int:
        return int(np.argmax(np.ctypeslib.as_array(ctx.get_logits_ith(i), shape=(n_vocab,))))

    tokens = []
    for s in range(lanes):  # each lane's prompt, then its first token
        batch.reset()
        batch.add_sequence(prompts[s], s, False)
        ctx.decode(batch)
        tokens.append(argmax(len(prompts[s]) - 1))
    b = batch.batch
    t = time.perf_counter()
    for step in range(args.new):
        b.n_tokens = lanes
        for s in range(lanes):
            b.token[s], b.pos[s], b.n_seq_id[s], b.logits[s] = tokens[s], len(prompts[s]) + step, 1, True
            b.seq_id[s][0] = s
        ctx.decode(batch)
        tokens = [argmax(s) for s in range(lanes)]
    return time.perf_counter() - t

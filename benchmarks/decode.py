"""Prefill and decode speed on one GGUF file: strata vs llama.cpp (vs transformers).

Each arm runs in its own interpreter (so load time and peak RSS are its own), arms are
interleaved over several rounds, and the table reports medians and each strata row's
ratio to each peer; a second table gives each arm's decode speed round by round and each
strata row's ratio to each peer within a round (on a machine whose neighbours come and go,
the spread says how far one run's medians can be trusted). Same file (`--model`, the default model's SmolLM2-135M-Instruct Q4_1
GGUF unless given), the same token ids for every arm (tokenized once, here), bf16 compute,
the same thread count, a 512-token prompt.

Strata runs up to four ways, so that each comparison is like for like: `--weights auto`
(its default: decode steps read the file's quantized blocks in place, prompt pieces a
dense copy), `--weights native` (the file's blocks only, at every step: the memory mode),
`--weights dense` (dequantised bf16 weights, as transformers holds them), `--weights auto`
with $STRATA_Q4_KERNEL=x8 (`auto-x8`: Q4_0/Q4_1 decode rows on strata's x8 kernel, the
default, named), with $STRATA_HEAD_KERNEL=int8 (`auto-int8head`: the head's decode rows on
torch's int8 kernel, where auto would read the file's head in place: AVX2-only CPUs), `auto-int8act`
and `auto-int8kv` (8-bit activations for the x8 projections, int8 K/V: accuracy trades the
defaults do not make, named as such), and `--weights auto` with `--kv-pool-tokens` (the shared pool, sized as the 8 lanes' reservations; the
"pool / reserved" row shows what the pool costs at short contexts). transformers runs
dense bf16; llama.cpp reads the file as it is.

    python benchmarks/decode.py [--model PATH] [--label TEXT] [--rounds 3] [--new 128] [--threads 2]
                                [--strata auto,auto-x8,auto-int8head,auto-int8act,auto-int8kv,auto-python-layers,native,dense,pool] [--peers transformers,llama.cpp] [--quick]

`--quick` runs strata's `--weights auto` arm alone (no peer: transformers and llama.cpp are
measured in full runs only, and the output says so) on a 32-token prompt, 4 new tokens, one round.

llama.cpp runs when `llama_cpp` (llama-cpp-python, the optional `llamacpp` extra) is
importable (benchmarks/decode_parts/llamacpp.py). Peak RSS is each process's whole peak;
"over runtime" subtracts the RSS its runtime had after import, before loading the model
(torch for strata and transformers, llama_cpp for llama.cpp): what the engine itself holds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import add_quick_and_out, cpu_name, interleaved, medians, peak_rss_mib, print_table, rss_mib, run_arm, write_json
from benchmarks.decode_parts import llamacpp
from benchmarks.decode_parts.plot import plot
from benchmarks.decode_parts.rounds import round_rows

PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs each evening, counting the steps as his father "
    "had taught him, and watched the ships pass beyond the reef while the gulls settled on the rocks. "
)
LANES = 8
KV_CHUNK = 128  # each lane reserves about what it uses, as transformers' static cache does
# --strata value -> arm
STRATA_ARMS = {"auto": "strata", "auto-x8": "strata-x8", "auto-int8head": "strata-int8head",
               "auto-int8act": "strata-int8act", "auto-int8kv": "strata-int8kv",
               "auto-python-layers": "strata-python-layers", "native": "strata-native",
               "dense": "strata-dense",
               "pool": "strata-pool"}
PEERS = ("transformers", "llama.cpp")


def labels(label: str) -> dict[str, str]:
    return {"strata": f"strata {label} (--weights auto)", "strata-native": f"strata {label} (--weights native)",
            "strata-x8": f"strata {label} (--weights auto, STRATA_Q4_KERNEL=x8)",
            "strata-int8head": f"strata {label} (--weights auto, STRATA_HEAD_KERNEL=int8)",
            "strata-int8act": f"strata {label} (--weights auto, STRATA_Q4_KERNEL=x8-int8: 8-bit activations, an accuracy trade)",
            "strata-int8kv": f"strata {label} (--weights auto, --kv int8: an accuracy trade)",
            "strata-python-layers": f"strata {label} (--weights auto, layers on their Python path)",
            "strata-dense": "strata dense bf16 (--weights dense)",
            "strata-pool": f"strata {label}, pool (--kv-pool-tokens)", "transformers": "transformers dense bf16",
            "llama.cpp": f"llama.cpp {label}"}


def prompt_ids(tokenizer, n: int, variant: int) -> list[int]:
    ids = tokenizer.encode(f"Story {variant}. " + PARAGRAPH * 40)
    return ids[:n]


def all_prompts(model: str, n: int) -> dict:
    """The token ids every arm reads (strata's tokenizer of the file; each arm gets the same)."""
    from strata.loader import open_model

    tok = open_model(model).tokenizer
    return {"warmup": prompt_ids(tok, min(64, n), 99), "prefill": [prompt_ids(tok, n, v) for v in range(3)],
            "one": prompt_ids(tok, n, 10), "eight": [prompt_ids(tok, n, 20 + i) for i in range(LANES)]}


def read_prompts(args) -> dict:
    with open(args.prompts) as f:
        return json.load(f)


def speeds(args, load_s: float, prefill_s: float, dec1_s: float, dec8_s: float, base_rss: float) -> dict:
    """One arm's row: seconds in, rates out."""
    peak = peak_rss_mib()
    return {
        "load_s": load_s,
        "prefill_tok_s": args.prompt / prefill_s,
        "decode_tok_s": args.new / dec1_s,
        "decode8_tok_s": LANES * args.new / dec8_s,
        "peak_rss_mib": peak,
        "peak_over_runtime_mib": peak - base_rss,
    }


def arm_strata(args) -> dict:
    import torch

    from strata.config import EngineConfig
    from strata.engine.engine import Engine
    from strata.sampling import SamplingParams

    torch.set_num_threads(args.threads)
    prompts = read_prompts(args)
    base_rss = rss_mib()
    t0 = time.perf_counter()
    engine = Engine(EngineConfig(model=args.model, dtype="bfloat16", weights=args.weights,
                                 max_context=max_context(args),
                                 batch=LANES - 1, kv_chunk=KV_CHUNK, kv_pool_tokens=args.kv_pool_tokens,
                                 kv=getattr(args, "kv", None),
                                 prefill_chunk=args.prompt, threads=args.threads,
                                 spec="off"),  # one token a step, as the peers decode (drafts: spec.py)
                    progress=False)
    load_s = time.perf_counter() - t0
    if getattr(args, "python_layers", False):  # the layers' Python path at every step (models/fused_layer.py)
        for layer in engine._model.layers:
            layer.fused = None

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

    run([prompts["warmup"]], 4)  # warm-up
    prefill_s = min(run([ids], 1)[0] for ids in prompts["prefill"])
    _, dec1 = run([prompts["one"]], args.new + 1)
    _, dec8 = run(prompts["eight"], args.new + 1)
    return speeds(args, load_s, prefill_s, dec1, dec8, base_rss)


def max_context(args) -> int:
    return args.prompt + args.new + 8


def arm_strata_dense(args) -> dict:
    """The strata arm with dequantised weights (`--weights dense`)."""
    return arm_strata(argparse.Namespace(**{**vars(args), "weights": "dense"}))


def arm_strata_x8(args) -> dict:
    """The auto arm with Q4_0/Q4_1 decode rows on strata's x8 kernel instead of torch's int4
    kernel (models/linear.py): both sides of the choice in one interleaved run."""
    os.environ["STRATA_Q4_KERNEL"] = "x8"
    return arm_strata(args)


def arm_strata_int8head(args) -> dict:
    """The auto arm with the head's decode rows on torch's int8 kernel (models/head.py)."""
    os.environ["STRATA_HEAD_KERNEL"] = "int8"
    return arm_strata(args)


def arm_strata_int8act(args) -> dict:
    """The auto arm with 8-bit activations for the x8 projections ($STRATA_Q4_KERNEL=x8-int8,
    llama.cpp's own activation width): less integer work a token, an accuracy trade the
    default does not make."""
    os.environ["STRATA_Q4_KERNEL"] = "x8-int8"
    return arm_strata(args)


def arm_strata_int8kv(args) -> dict:
    """The auto arm with int8 K/V (`--kv int8`): half the K/V bytes a step reads, an accuracy
    trade the default does not make."""
    return arm_strata(argparse.Namespace(**{**vars(args), "kv": "int8"}))


def arm_strata_python_layers(args) -> dict:
    """The auto arm with every layer on its Python path (the fused ops one call each) instead of
    one extension call per layer at decode steps (models/fused_layer.py)."""
    return arm_strata(argparse.Namespace(**{**vars(args), "python_layers": True}))


def arm_strata_native(args) -> dict:
    """The strata arm holding only the file's quantized blocks (`--weights native`)."""
    return arm_strata(argparse.Namespace(**{**vars(args), "weights": "native"}))


def arm_strata_pool(args) -> dict:
    """The strata arm in the shared pool, holding exactly the K/V the reserved layout
    reserves (LANES lanes of --max-context in whole chunks): only the layout differs."""
    pool_tokens = LANES * -(-max_context(args) // KV_CHUNK) * KV_CHUNK
    return arm_strata(argparse.Namespace(**{**vars(args), "kv_pool_tokens": pool_tokens}))


def arm_transformers(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    prompts = read_prompts(args)
    base_rss = rss_mib()
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(args.model), gguf_file=os.path.basename(args.model), dtype=torch.bfloat16
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

    gen([prompts["warmup"]], 4)  # warm-up
    prefill_s = min(gen([ids], 1) for ids in prompts["prefill"])
    one = [prompts["one"]]
    dec1 = gen(one, args.new + 1) - gen(one, 1)
    eight = prompts["eight"]
    dec8 = gen(eight, args.new + 1) - gen(eight, 1)
    return speeds(args, load_s, prefill_s, dec1, dec8, base_rss)


def arm_llamacpp(args) -> dict:
    r = llamacpp.run(args, read_prompts(args), LANES)
    return speeds(args, r["load_s"], r["prefill_s"], r["dec1_s"], r["dec8_s"], r["base_rss_mib"])


ARMS = {"strata": arm_strata, "strata-x8": arm_strata_x8, "strata-int8head": arm_strata_int8head,
        "strata-int8act": arm_strata_int8act, "strata-int8kv": arm_strata_int8kv,
        "strata-python-layers": arm_strata_python_layers,
        "strata-native": arm_strata_native,
        "strata-dense": arm_strata_dense,
        "strata-pool": arm_strata_pool, "transformers": arm_transformers, "llama.cpp": arm_llamacpp}
METRICS = ["prefill_tok_s", "decode_tok_s", "decode8_tok_s", "load_s", "peak_rss_mib", "peak_over_runtime_mib"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", choices=sorted(ARMS))
    p.add_argument("--model", default=None, help="a GGUF file (default: the default model's)")
    p.add_argument("--label", default=None, help="what the file holds, for the table (default: its name)")
    p.add_argument("--prompts", default=None, help=argparse.SUPPRESS)  # the arms' token ids (a JSON file)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--strata", default="auto,native,dense,pool",
                   help="strata rows: auto, native, dense (--weights) and pool (--kv-pool-tokens)")
    p.add_argument("--peers", default=",".join(PEERS), help="peer rows: transformers, llama.cpp")
    add_quick_and_out(p, "strata's auto arm only (no peers), 32-token prompt, 4 new tokens, 1 round")
    p.set_defaults(weights="auto", kv_pool_tokens=None)  # the strata arm's; its variants replace them
    args = p.parse_args()
    if args.arm:
        print(json.dumps(ARMS[args.arm](args)))
        return
    from strata.loader.default import default_model_path

    args.model = os.path.abspath(args.model or default_model_path())
    if args.quick:
        args.prompt, args.new, args.rounds, args.strata, args.peers = 32, 4, 1, "auto", ""
        print("--quick: strata's arm only; the peers (transformers, llama.cpp) were not run")
    label = args.label or os.path.splitext(os.path.basename(args.model))[0]
    chosen = [x.strip() for x in args.strata.split(",") if x.strip()]
    if not chosen or set(chosen) - set(STRATA_ARMS):
        p.error(f"--strata: choose from {', '.join(STRATA_ARMS)} (got {args.strata!r})")
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    if set(peers) - set(PEERS):
        p.error(f"--peers: choose from {', '.join(PEERS)} (got {args.peers!r})")
    strata_arms = [STRATA_ARMS[x] for x in STRATA_ARMS if x in chosen]
    arms = strata_arms + [x for x in PEERS if x in peers]
    if "llama.cpp" in arms:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama.cpp: llama-cpp-python is not installed; its arm is left out", file=sys.stderr)
            arms.remove("llama.cpp")
    prompts_file = write_json("decode-prompts.json", all_prompts(args.model, args.prompt), args.out)
    passthrough = ["--model", args.model, "--prompts", prompts_file, "--prompt", str(args.prompt),
                   "--new", str(args.new), "--threads", str(args.threads)]
    load_before = os.getloadavg()
    raw = interleaved(arms, args.rounds, lambda arm: run_arm(__file__, arm, passthrough))
    med = {arm: medians(rows) for arm, rows in raw.items()}
    names = labels(label)
    rows = [[names[arm]] + [med[arm][m] for m in METRICS] for arm in arms]
    peer_arms = [a for a in arms if a not in strata_arms]
    for arm in strata_arms:
        for peer in peer_arms:
            rows.append([f"{names[arm]} / {peer}"] + [med[arm][m] / med[peer][m] for m in METRICS])
    if {"strata", "strata-pool"} <= set(arms):
        rows.append(["pool / reserved (strata)"] + [med["strata-pool"][m] / med["strata"][m] for m in METRICS])
    table = print_table(
        f"decode benchmark: {os.path.basename(args.model)}, {args.prompt}-token prompt, {args.new} new tokens, "
        f"{args.threads} threads, bf16 compute, median of {args.rounds} interleaved rounds on {cpu_name()}; "
        f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after; strata's pool row holds the "
        f"same K/V as its {LANES} reserved lanes ({KV_CHUNK}-cell chunks)",
        ["arm", "prefill tok/s", "decode tok/s (1 lane)", f"decode tok/s ({LANES} lanes)", "load s", "peak RSS MiB",
         "peak RSS over runtime MiB"],
        rows,
    )
    if args.rounds > 1:
        table += "\n" + print_table(
            "decode tok/s by round, in run order (a round runs every arm once, one after another)",
            ["arm", "decode tok/s (1 lane)", f"decode tok/s ({LANES} lanes)"],
            round_rows(raw, strata_arms, peer_arms, names),
        )
    stem = "decode" if args.model == os.path.abspath(default_model_path()) else f"decode-{label}"
    path = write_json(f"{stem}.json", {"args": vars(args), "label": label, "raw": raw, "median": med,
                                       "table": table, "loadavg": [load_before, os.getloadavg()]}, args.out)
    plot(med, names, os.path.splitext(path)[0] + ".png")
    print(f"raw numbers: {path} (plot: {os.path.basename(os.path.splitext(path)[0])}.png next to it)")


if __name__ == "__main__":
    main()

"""The engine's command-line flags, shared by `strata generate` and `strata serve`.

Both commands import this module; it imports neither of them (so `strata.cli` and
`strata.server.cli` do not import each other for it).
"""

from __future__ import annotations

import argparse

from strata.config import (
    DEFAULT_KV_CHUNK,
    DEFAULT_MEMORY_GUARD_MIB,
    DEFAULT_PREFILL_CHUNK,
    DEFAULT_SPEC_K,
    DTYPES,
    SPEC_MODES,
    KV_DTYPES,
    WEIGHT_FORMATS,
    EngineConfig,
    parse_devices,
)
from strata.kv.residency import POLICIES
from strata.kv.ring_rule import DEFAULT_PAGE, DEFAULT_RING
from strata.moe.evict import DEFAULT_EVICT, EVICT_POLICIES


def add_engine_args(
    p: argparse.ArgumentParser, default_batch: int = 0, default_prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    default_prefill_alone: int | None = None,
) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", "-m", default=None, help="a .gguf file or a Hugging Face directory (default: the embedded SmolLM2-135M-Instruct)")
    g.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="compute dtype of the weights")
    g.add_argument("--weights", choices=WEIGHT_FORMATS, default="auto", help="keep GGUF 4-bit blocks (native) or dequantise (dense)")
    g.add_argument("--kv", choices=KV_DTYPES, default=None, help="K/V dtype (default: bf16, or f32 with --dtype float32); int8: int8 with a float16 scale per cell and head")
    g.add_argument("--max-context", type=int, default=None, help="cells per conversation (default: the model's trained length)")
    g.add_argument("--batch", "--slots", dest="batch", type=int, default=default_batch, help="batch slots besides the main session")
    g.add_argument("--kv-chunk", type=int, default=DEFAULT_KV_CHUNK, help="cells per chunk")
    g.add_argument("--kv-pool-tokens", type=int, default=None, help="one shared pool of N cells per layer for all lanes")
    g.add_argument("--kv-window-groups", choices=("on", "off"), default="on",
                   help="with --kv-pool-tokens: sliding-window layers hold only their windows (docs/windows.md)")
    g.add_argument("--kv-window-keep", type=int, default=None,
                   help="idle conversations' windows each window group holds besides every lane's (default: one per lane)")
    g.add_argument("--kv-resident", type=int, default=None,
                   help="cells per layer each lane keeps on the compute device; the rest streams from the pool by pages")
    g.add_argument("--kv-page", type=int, default=None, help=f"cells per page of the ring (default {DEFAULT_PAGE}; divides --kv-chunk)")
    g.add_argument("--kv-evict", choices=POLICIES, default="clock", help="which pages stay resident when the set changes")
    g.add_argument("--kv-ring-default", type=int, default=DEFAULT_RING,
                   help="the ring a shallow run keeps with STRATA_KV_RING_ADAPT=1")
    g.add_argument("--kv-ring-budget", type=int, default=None,
                   help="device cells per layer for all lanes' rings together (default: lanes x --kv-resident)")
    g.add_argument("--moe-resident", type=int, default=None,
                   help="expert slots per MoE layer on the compute device (default: every expert resident)")
    g.add_argument("--moe-evict", choices=EVICT_POLICIES, default=DEFAULT_EVICT,
                   help="which cached expert gives its slot to a missing one")
    g.add_argument("--moe-prefetch", action="store_true",
                   help="copy the next layer's likely experts (its router on this layer's hidden state) ahead")
    g.add_argument("--device-memory", type=int, default=None, metavar="MIB",
                   help="one device budget for resident weights, expert slots and every lane's ring")
    g.add_argument("--moe-resident-min", type=int, default=None,
                   help="with --device-memory: the fewest expert slots per layer (default: experts per token)")
    g.add_argument("--spec", choices=SPEC_MODES, default="ngram",
                   help="speculative decoding: ngram (prompt lookup drafts, verified in one step), draft (--draft-model), off")
    g.add_argument("--spec-k", type=int, default=DEFAULT_SPEC_K, help="drafts a lane proposes a step, at most")
    g.add_argument("--draft-model", default=None, help="with --spec draft: a smaller model with the same tokenizer")
    g.add_argument("--prefill-chunk", type=int, default=default_prefill_chunk, help="prompt tokens read per step")
    g.add_argument("--prefill-alone", type=int, default=default_prefill_alone,
                   help="prompt tokens read per step when no lane is decoding (default: --prefill-chunk)")
    g.add_argument("--devices", type=parse_devices, default=("cpu",), help="comma-separated devices for a layer split, e.g. cpu,cpu")
    g.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    g.add_argument("--memory-guard-mib", type=int, default=DEFAULT_MEMORY_GUARD_MIB, help="refuse to start if less would stay available")
    g.add_argument("--verbose", "-v", action="store_true", help="log engine decisions")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model, dtype=args.dtype, weights=args.weights, kv=args.kv, max_context=args.max_context,
        batch=args.batch, kv_chunk=args.kv_chunk, kv_pool_tokens=args.kv_pool_tokens,
        prefill_chunk=args.prefill_chunk, prefill_alone=args.prefill_alone, devices=args.devices, threads=args.threads,
        memory_guard_mib=args.memory_guard_mib, kv_resident=args.kv_resident, kv_page=args.kv_page,
        kv_evict=args.kv_evict, kv_ring_default=args.kv_ring_default, kv_ring_budget=args.kv_ring_budget,
        spec=args.spec, spec_k=args.spec_k, draft_model=args.draft_model,
        moe_resident=args.moe_resident, moe_evict=args.moe_evict, moe_prefetch=args.moe_prefetch,
        device_memory=args.device_memory, moe_resident_min=args.moe_resident_min,
        kv_window_groups=args.kv_window_groups == "on", kv_window_keep=args.kv_window_keep,
    )
